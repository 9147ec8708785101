"""Quick-look PNG figures of a run: grey panels side by side, each with its caption, a title
and a grey scale bar with its range and units.

Drawn with Pillow in tens of milliseconds; matplotlib's import, layout and text cost about a
second of every run that drew with it. The data themselves are in the run's zarr outputs;
these images are for a glance.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

#: The panels' least height on the page (a panel is enlarged by a whole factor up to it), px.
MIN_PANEL = 256
#: Blank space between and around panels, and the height of a line of text, px.
GAP, LINE = 12, 16


def grey(image: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """``image`` as 8-bit grey from ``lo`` (black) to ``hi`` (white), its first axis drawn
    upwards (row 0 at the bottom); NaN is black."""
    scale = 255.0 / (hi - lo) if hi > lo else 0.0
    values = np.nan_to_num((np.asarray(image, np.float64) - lo) * scale, nan=0.0)
    return np.clip(values, 0, 255).astype(np.uint8)[::-1]


def panels(path: str | Path, images: Sequence[tuple[str, np.ndarray]], title: str,
           lo: float, hi: float, units: str) -> None:
    """Write ``path``: the 2-D ``images`` (caption, array) side by side in grey from ``lo``
    to ``hi`` (see ``grey``), each enlarged by the same whole factor, under ``title``, with a
    scale bar labelled in ``units``."""
    from PIL import Image, ImageDraw, ImageFont

    height = max(image.shape[0] for _, image in images)
    zoom = max(1, -(-MIN_PANEL // height))
    drawn = [Image.fromarray(grey(image, lo, hi)).resize(
        (image.shape[1] * zoom, image.shape[0] * zoom), Image.Resampling.NEAREST)
        for _, image in images]
    bar = Image.fromarray(np.repeat(np.linspace(255, 0, height * zoom)[:, None], 12, axis=1)
                          .astype(np.uint8))
    width = sum(d.width for d in drawn) + GAP * (len(drawn) + 1) + bar.width + 8 * LINE
    top = 2 * LINE + GAP
    page = Image.new("L", (width, top + height * zoom + GAP), 255)
    draw = ImageDraw.Draw(page)
    draw.font = ImageFont.load_default(size=LINE - 3)
    draw.text((GAP, 4), title, fill=0)
    x = GAP
    for (caption, _), panel in zip(images, drawn, strict=True):
        draw.text((x, LINE + 4), caption, fill=0)
        page.paste(panel, (x, top))
        x += panel.width + GAP
    page.paste(bar, (x, top))
    draw.text((x + bar.width + 4, top), f"{hi:.4g}", fill=0)
    draw.text((x + bar.width + 4, top + bar.height - LINE), f"{lo:.4g}", fill=0)
    draw.text((x, LINE + 4), units, fill=0)
    page.save(path, format="PNG", compress_level=1)
