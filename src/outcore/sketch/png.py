"""The quick-look figures of a sketch: the scree plot and the first right factors as images.

The right factors are grey panels of ``outcore.figures``. The scree plot, a bar chart that
module does not draw, is drawn here with Pillow in its style (white page, black ink, the
title on top, its text sizes and gaps).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from outcore import figures

#: Right factors drawn in components.png.
SHOWN = 6
#: The scree plot's drawing area and margin, px.
WIDTH, HEIGHT, MARGIN = 560, 300, 60


def scree(path: str | Path, singular_values: np.ndarray, ratio: np.ndarray, title: str
          ) -> None:
    """Write ``path``: one bar per component, its singular value over the largest on a log
    scale (a grid line a decade), with the share of the sum of squares the components
    explain (``ratio``: each component's share) after the title."""
    from PIL import Image, ImageDraw, ImageFont

    s = np.asarray(singular_values, np.float64)
    top = s[0] if s.size and s[0] > 0 else 1.0
    relative = np.clip(s / top, 1e-12, 1.0)
    decades = max(1, math.ceil(-math.log10(relative.min())))
    page = Image.new("L", (WIDTH + 2 * MARGIN, HEIGHT + 2 * MARGIN), 255)
    draw = ImageDraw.Draw(page)
    draw.font = ImageFont.load_default(size=figures.LINE - 3)
    draw.text((figures.GAP, 6), f"{title}; {100 * float(np.sum(ratio)):.2f} % of the sum of"
              " squares", fill=0)
    x0, y0 = MARGIN, MARGIN
    for d in range(decades + 1):
        y = y0 + HEIGHT * d / decades
        draw.line((x0, y, x0 + WIDTH, y), fill=200)
        draw.text((6, y - 6), f"1e-{d}" if d else "1", fill=0)
    step = WIDTH / max(1, s.size)
    for j, value in enumerate(relative):
        height = HEIGHT * (1 + math.log10(value) / decades)
        left = x0 + (j + 0.15) * step
        draw.rectangle((left, y0 + HEIGHT - height, left + max(1.0, 0.7 * step), y0 + HEIGHT),
                       fill=60)
    every = max(1, math.ceil(s.size / 16))
    for j in range(0, s.size, every):
        draw.text((x0 + (j + 0.3) * step, y0 + HEIGHT + 4), str(j), fill=0)
    draw.text((x0 + WIDTH / 2 - 40, y0 + HEIGHT + figures.LINE + 8), "component", fill=0)
    draw.text((x0, y0 - figures.LINE - 4), "singular value / largest", fill=0)
    page.save(path, format="PNG", compress_level=1)


def components(path: str | Path, v: np.ndarray, singular_values: np.ndarray) -> None:
    """Write ``path``: the first ``SHOWN`` right factors ``v`` (``(k, *pixel_shape)``) as grey
    images on one symmetric scale, row 0 on top, captioned with their singular values. A
    factor of one pixel dim is drawn as a strip; more than two are folded into two."""
    shown = np.asarray(v[:SHOWN], np.float64)
    if shown.ndim == 2:
        shown = np.repeat(shown[:, None, :], max(1, shown.shape[1] // 8), axis=1)
    elif shown.ndim > 3:
        shown = shown.reshape(shown.shape[0], -1, shown.shape[-1])
    bound = float(np.abs(shown).max()) or 1.0
    figures.panels(path, [(f"v{j}  s={singular_values[j]:.4g}", image[::-1])
                          for j, image in enumerate(shown)],
                   "right factors (unit norm)", -bound, bound, "value")
