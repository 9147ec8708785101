"""The PNG of a series' light curves: one panel per source (the most detected first), the
flux gained since the reference against time, with 1-sigma error bars and the zero line.

Drawn with Pillow, as the run's other PNGs are (``outcore.diffim.png``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

#: Panels drawn at most, their size and margins, pixels.
MOST = 6
WIDTH, HEIGHT, LEFT, GAP, LINE = 640, 150, 90, 10, 14
#: Colours (RGB) of detected and undetected epochs, and of the axes.
DETECTED, UNDETECTED, AXES = (20, 90, 200), (150, 150, 150), (0, 0, 0)


def draw_lightcurves(path: str | Path, table: pd.DataFrame, title: str) -> None:
    """Write ``path``: the light curves of ``table`` (``series.COLUMNS``) of up to ``MOST``
    sources, each panel's flux axis from its own lowest to highest point and error."""
    from PIL import Image, ImageDraw, ImageFont

    ids = list(dict.fromkeys(table["source_id"]))[:MOST]
    page = Image.new("RGB", (LEFT + WIDTH + GAP, 2 * LINE + len(ids) * (HEIGHT + GAP) + LINE),
                     (255, 255, 255))
    draw = ImageDraw.Draw(page)
    draw.font = ImageFont.load_default(size=LINE - 2)
    draw.text((GAP, 4), title, fill=AXES)
    if not ids:
        draw.text((GAP, 2 * LINE), "no variable source", fill=AXES)
        page.save(path, format="PNG")
        return
    t = table["time"].to_numpy()
    t0, t1 = float(t.min()), float(t.max())
    span = (t1 - t0) or 1.0
    for row, source in enumerate(ids):
        curve = table[table["source_id"] == source]
        flux, err = curve["flux"].to_numpy(), curve["flux_err"].to_numpy()
        ok = np.isfinite(flux) & np.isfinite(err)
        lo = float(min(0.0, (flux - err)[ok].min())) if ok.any() else -1.0
        hi = float(max(0.0, (flux + err)[ok].max())) if ok.any() else 1.0
        hi = hi if hi > lo else lo + 1.0
        top = 2 * LINE + row * (HEIGHT + GAP)

        def px(time: float, value: float, top: int = top, lo: float = lo,
               hi: float = hi) -> tuple[float, float]:
            return (LEFT + (time - t0) / span * (WIDTH - 8) + 4,
                    top + HEIGHT - 4 - (value - lo) / (hi - lo) * (HEIGHT - 8))

        draw.rectangle((LEFT, top, LEFT + WIDTH, top + HEIGHT), outline=AXES)
        draw.line((px(t0, 0.0)[0] - 4, px(t0, 0.0)[1], LEFT + WIDTH, px(t0, 0.0)[1]),
                  fill=UNDETECTED)
        first = curve.iloc[0]
        draw.text((4, top), f"source {source}", fill=AXES)
        draw.text((4, top + LINE), f"x {first['x']:.1f}", fill=AXES)
        draw.text((4, top + 2 * LINE), f"y {first['y']:.1f}", fill=AXES)
        draw.text((4, top + 3 * LINE), f"max {hi:.4g}", fill=AXES)
        draw.text((4, top + HEIGHT - LINE), f"min {lo:.4g}", fill=AXES)
        for time, f, e, seen in zip(curve["time"], flux, err, curve["detected"], strict=True):
            if not (np.isfinite(f) and np.isfinite(e)):
                continue
            colour = DETECTED if seen else UNDETECTED
            x, y = px(time, f)
            draw.line((x, px(time, f - e)[1], x, px(time, f + e)[1]), fill=colour)
            draw.ellipse((x - 3, y - 3, x + 3, y + 3), fill=colour)
    key = table["time_key"].iloc[0]
    bottom = 2 * LINE + len(ids) * (HEIGHT + GAP)
    draw.text((LEFT, bottom), f"{key} {t0:.5f}", fill=AXES)
    draw.text((LEFT + WIDTH - 160, bottom), f"{key} {t1:.5f}", fill=AXES)
    page.save(path, format="PNG")
