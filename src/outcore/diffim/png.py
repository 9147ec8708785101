"""The PNG of one item: its difference image (a preview) with the detections marked."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from outcore.diffim.tile import COLUMNS, TileResult


def preview_image(shape: tuple[int, int], step: int, tiles: Sequence[TileResult]) -> np.ndarray:
    """Every ``step``-th pixel of ``D`` (rows and columns from 0), from the tiles' previews."""
    out = np.full((math.ceil(shape[0] / step), math.ceil(shape[1] / step)), np.nan,
                  dtype=np.float32)
    for tile in tiles:
        y0, _, x0, _ = tile.core
        py, px = -(-y0 // step), -(-x0 // step)
        h, w = tile.preview.shape
        out[py: py + h, px: px + w] = tile.preview
    return out


def draw_item(path: str, item_id: str, shape: tuple[int, int], step: int,
              tiles: Sequence[TileResult], threshold: float) -> str:
    """Write ``path``: ``D`` from -5 to 5 (its background sigma is 1) in grey, positive
    singles in green, negative ones in red, dipoles in yellow; returns ``path``."""
    from matplotlib.figure import Figure

    image = preview_image(shape, step, tiles)
    table = np.concatenate([t.table for t in tiles]) if tiles else np.empty((0, len(COLUMNS)))
    col = {name: table[:, j] for j, name in enumerate(COLUMNS)}
    dipole = col["is_dipole"] > 0
    fig = Figure(figsize=(6, 6 * shape[0] / shape[1] + 0.5))
    ax = fig.add_subplot()
    ax.imshow(image, cmap="gray", vmin=-5, vmax=5, origin="lower",
              extent=(-0.5, image.shape[1] * step - 0.5, -0.5, image.shape[0] * step - 0.5))
    for keep, color, marker, label in (
            (~dipole & (col["snr"] > 0), "lime", "o", "positive"),
            (~dipole & (col["snr"] < 0), "red", "o", "negative"),
            (dipole, "yellow", "s", "dipole")):
        ax.scatter(col["x"][keep], col["y"][keep], s=80, facecolors="none", edgecolors=color,
                   marker=marker, linewidths=1.2, label=f"{label} ({int(keep.sum())})")
    ax.set_xlim(-0.5, shape[1] - 0.5)
    ax.set_ylim(-0.5, shape[0] - 0.5)
    ax.set_title(f"{item_id}: D with |S_corr| >= {threshold:g}")
    ax.set_xlabel("x (pixels)")
    ax.set_ylabel("y (pixels)")
    ax.legend(loc="upper right", fontsize=8)
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.08, top=0.94)
    fig.savefig(path, dpi=80)
    return path
