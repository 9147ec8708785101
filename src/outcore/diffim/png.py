"""The PNG of one item: its difference image (a preview) with the detections marked.

The preview is every ``step``-th pixel of ``D`` read back from ``difference.zarr``
(``draw_stored``, a task on a worker), so its longest side is at most ``PREVIEW_SIDE``.
Drawn with Pillow (the imaging library matplotlib itself writes PNGs with): the preview is
one image and a few marks, which Pillow draws in about 0.07 s of CPU where matplotlib's
import and figure cost about 1 s in every run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from outcore import figures

#: Colours (RGB) of positive singles, negative singles and dipoles, and of excluded pixels.
POSITIVE, NEGATIVE, DIPOLE, EXCLUDED = (0, 230, 0), (235, 40, 40), (255, 215, 0), (30, 40, 90)
#: The drawing's least side (the preview is enlarged by a whole factor up to it), pixels.
MIN_SIDE = 512
#: Longest side of an item's preview, pixels.
PREVIEW_SIDE = 512


def preview_step(shape: tuple[int, int]) -> int:
    """The pixel step of an item's preview, so its longest side is at most PREVIEW_SIDE."""
    return max(1, math.ceil(max(shape) / PREVIEW_SIDE))


def draw_stored(path: str, store: str, index: int, item_id: str, shape: tuple[int, int],
                columns: Mapping[str, np.ndarray], threshold: float) -> str:
    """``draw_item`` of pair ``index`` of the ``difference.zarr`` at ``store`` (its own
    ``shape`` of the stacked ``(pair, y, x)`` arrays), read every ``preview_step`` pixels."""
    import zarr

    step = preview_step(shape)
    preview = zarr.open_array(store, path="difference", mode="r")[
        index, : shape[0]: step, : shape[1]: step]
    return draw_item(path, item_id, np.asarray(preview), step, columns, threshold)


def draw_item(path: str, item_id: str, preview: np.ndarray, step: int,
              columns: Mapping[str, np.ndarray], threshold: float) -> str:
    """Write ``path``: the ``preview`` of ``D`` (every ``step``-th pixel) from -5 to 5 (its
    background sigma is 1) in grey, ``y`` upwards, excluded pixels dark blue; circles on the
    positive singles (green) and negative ones (red) of ``columns`` (``x``, ``y``, ``snr``,
    ``is_dipole`` of the item's sources), squares on dipoles (yellow); a caption with the
    item and the counts. Returns ``path``."""
    from PIL import Image, ImageDraw

    image = np.asarray(preview, dtype=np.float32)
    zoom = max(1, MIN_SIDE // max(image.shape))
    rgb = np.repeat(figures.grey(image, -5.0, 5.0)[..., None], 3, axis=2)  # y upwards
    rgb[np.isnan(image)[::-1]] = EXCLUDED
    rgb = np.repeat(np.repeat(rgb, zoom, axis=0), zoom, axis=1)
    caption = 18
    canvas = Image.new("RGB", (rgb.shape[1], rgb.shape[0] + caption), (255, 255, 255))
    canvas.paste(Image.fromarray(rgb), (0, caption))
    draw = ImageDraw.Draw(canvas)
    dipole = np.asarray(columns["is_dipole"]).astype(bool)
    snr = np.asarray(columns["snr"])
    scale = zoom / step
    counts = []
    for keep, colour, square, label in ((~dipole & (snr > 0), POSITIVE, False, "positive"),
                                        (~dipole & (snr < 0), NEGATIVE, False, "negative"),
                                        (dipole, DIPOLE, True, "dipoles")):
        for x, y in zip(np.asarray(columns["x"])[keep], np.asarray(columns["y"])[keep],
                        strict=True):
            u = (x + 0.5) * scale
            v = caption + rgb.shape[0] - (y + 0.5) * scale
            box = (u - 7, v - 7, u + 7, v + 7)
            (draw.rectangle if square else draw.ellipse)(box, outline=colour, width=2)
        counts.append(f"{label} {int(keep.sum())}")
    draw.text((4, 3), f"{item_id}: D (-5 to 5), |S_corr| >= {threshold:g}: "
              + ", ".join(counts), fill=(0, 0, 0))
    canvas.save(path, format="PNG", compress_level=1)  # 5x faster than 6, 25 % larger
    return path
