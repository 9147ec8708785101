"""``frc.png``: the Fourier ring correlation of the two half reconstructions against
frequency, with the half-bit threshold, its crossing and (given a truth) each half's FRC
against the true object; drawn with Pillow in the style of ``outcore.figures`` (white page,
black ink, the title on top)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from outcore import figures
from outcore.ptycho.reconstruction.frc import RingCorrelation

#: The plot's drawing area and margin, px.
WIDTH, HEIGHT, MARGIN = 560, 320, 60
#: Grey levels of the FRC, the threshold, the truth curves and the grid.
INK, THRESHOLD, TRUTH, GRID = 0, 150, 110, 215


def draw(path: str | Path, rings: RingCorrelation, against: Sequence[RingCorrelation],
         pixel_size: float, unit: str | None) -> None:
    """Write ``path``: FRC (black) and half-bit threshold (grey) from 0 to Nyquist on a
    -0.2 to 1 scale, vertical lines at the first (black) and last (grey) crossings
    (``RingCorrelation``), the halves' FRC against the truth
    (dashed), the frequency axis in cycles per pixel and, when ``unit`` is ``"m"``, the
    crossing's half-period resolution in nm (``pixel_size`` metres a pixel)."""
    from PIL import Image, ImageDraw, ImageFont

    page = Image.new("L", (WIDTH + 2 * MARGIN, HEIGHT + 2 * MARGIN), 255)
    pen = ImageDraw.Draw(page)
    pen.font = ImageFont.load_default(size=figures.LINE - 3)
    x0, y0, low = MARGIN, MARGIN, -0.2
    top = float(rings.frequency[-1]) or 0.5

    def at(f: np.ndarray, value: np.ndarray) -> list[tuple[float, float]]:
        y = y0 + HEIGHT * (1 - (np.clip(value, low, 1) - low) / (1 - low))
        return list(zip((x0 + WIDTH * f / top).tolist(), y.tolist(), strict=True))

    for level in (0.0, 0.5, 1.0):
        (_, y), = at(np.zeros(1), np.array([level]))
        pen.line((x0, y, x0 + WIDTH, y), fill=GRID)
        pen.text((x0 - 28, y - 6), f"{level:g}", fill=INK)
    for tick in np.linspace(0, top, 6):
        (x, _), = at(np.array([tick]), np.zeros(1))
        pen.line((x, y0, x, y0 + HEIGHT), fill=GRID)
        pen.text((x - 12, y0 + HEIGHT + 4), f"{tick:.2g}", fill=INK)
    for other in against:
        points = at(other.frequency, other.frc)
        for start in range(0, len(points) - 1, 2):
            pen.line(points[start:start + 2], fill=TRUTH, width=1)
    pen.line(at(rings.frequency, rings.threshold), fill=THRESHOLD, width=2)
    pen.line(at(rings.frequency, rings.frc), fill=INK, width=2)
    crossing, last = rings.crossing, rings.last_crossing
    if crossing is None:
        said = "above the half-bit threshold to Nyquist"
    else:
        said = "half-bit crossing " + _resolution(crossing, pixel_size, unit)
        if last is not None and last != crossing:
            said += "; last " + _resolution(last, pixel_size, unit)
    for frequency, grey in ((crossing, INK), (last, THRESHOLD)):
        if frequency is not None:
            (x, _), = at(np.array([frequency]), np.zeros(1))
            pen.line((x, y0, x, y0 + HEIGHT), fill=grey)
    pen.text((figures.GAP, 4), "FRC of the two half-scan reconstructions", fill=INK)
    pen.text((figures.GAP, 4 + figures.LINE), said, fill=INK)
    legend = "black: FRC, grey: half-bit threshold" + (
        ", dashed: each half against the truth" if against else "")
    pen.text((x0, y0 - figures.LINE - 4), legend, fill=INK)
    pen.text((x0 + WIDTH / 2 - 70, y0 + HEIGHT + figures.LINE + 8),
             "spatial frequency, cycles per pixel", fill=INK)
    page.save(path, format="PNG", compress_level=1)


def _resolution(frequency: float, pixel_size: float, unit: str | None) -> str:
    """``frequency`` (cycles per pixel) and its half period in pixels (and nm or um)."""
    said = f"{frequency:.3g} / px ({0.5 / frequency:.3g} px"
    if unit == "m":
        nm = 0.5 / frequency * pixel_size * 1e9
        said += f", {nm:.3g} nm" if nm < 1000 else f", {nm / 1000:.3g} um"
    return said + ")"
