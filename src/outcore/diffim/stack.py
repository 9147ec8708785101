"""Groups of exposures of one field stacked into the reference or the target, window by window.

A ``StackedImage`` reads the same window of every member (FITS images on one pixel grid)
and combines them as it is read, so a stack is never written or held whole: ``median``
(robust to cosmic rays and satellite trails) or ``mean``, the inverse-variance weighted
mean (each member weighted by ``1 / sigma^2``, its sky noise measured once on its middle
``NOISE_WINDOW`` pixels a side, so every tile sees the same weights). Members are combined
as they are: give them on one flux scale. A pixel that is not finite in a member is left
out of that pixel's combination.

The stack's noise is what the background mesh measures on it; its ``gain`` (for the
sources' photon noise) is the members' mean gain times the number of exposures the
combination is worth: ``(sum w)^2 / sum w^2`` for the mean, ``2 / pi`` of the count for the
median (the median's efficiency on normal noise).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

#: How the members of a group are combined.
METHODS = ("median", "mean")
#: Side (pixels) of the middle window each member's noise is measured on, for the weights.
NOISE_WINDOW = 512


@dataclass(frozen=True)
class StackedImage:
    """Members (``manifest.ImageFile``, one shape) combined by ``method`` with ``weights``
    (``1 / sigma^2`` of each; used by ``mean``). Reads like one ``ImageFile``; its header
    (``path``, ``hdu``: WCS, zeropoint, time) is the first member's."""

    members: tuple[Any, ...]
    method: str
    weights: tuple[float, ...]

    @property
    def path(self) -> str:
        return self.members[0].path

    @property
    def hdu(self) -> int:
        return self.members[0].hdu

    @property
    def shape(self) -> tuple[int, int]:
        return self.members[0].shape

    @property
    def gain(self) -> float | None:
        """Electrons per unit of the stack's pixels, None when a member has no gain."""
        gains = [m.gain for m in self.members]
        if any(g is None for g in gains):
            return None
        w = np.asarray(self.weights)
        worth = (w.sum() ** 2 / (w * w).sum() if self.method == "mean"
                 else 2 / math.pi * len(self.members))
        return float(np.mean(gains)) * worth

    def read(self, y0: int, y1: int, x0: int, x1: int) -> np.ndarray:
        """Pixels ``[y0:y1, x0:x1]`` of the stack, float64; NaN where no member has one."""
        frames = np.stack([m.read(y0, y1, x0, x1) for m in self.members])
        finite = np.isfinite(frames)
        with np.errstate(invalid="ignore", divide="ignore"):
            if self.method == "median":
                return np.nanmedian(np.where(finite, frames, np.nan), axis=0) \
                    if not finite.all() else np.median(frames, axis=0)
            w = np.asarray(self.weights)[:, None, None] * finite
            total = (np.where(finite, frames, 0.0) * w).sum(axis=0)
            return np.where(w.sum(axis=0) > 0, total / w.sum(axis=0), np.nan)


def noise_weight(image: Any) -> float:
    """``1 / sigma^2`` of an image's sky: the 3-sigma clipped standard deviation of its
    middle ``NOISE_WINDOW`` pixels a side (astropy)."""
    from astropy.stats import sigma_clipped_stats

    ny, nx = image.shape
    hy, hx = min(ny, NOISE_WINDOW) // 2, min(nx, NOISE_WINDOW) // 2
    window = image.read(ny // 2 - hy, ny // 2 + hy, nx // 2 - hx, nx // 2 + hx)
    _, _, sigma = sigma_clipped_stats(window[np.isfinite(window)], sigma=3.0)
    return 1.0 / float(sigma) ** 2 if sigma > 0 else 0.0


def stack_images(members: list[Any], method: str) -> StackedImage:
    """The ``method`` stack of ``members`` (checked by the manifest: one shape, two or
    more), with their noise weights."""
    weights = tuple(noise_weight(m) for m in members) if method == "mean" \
        else tuple(1.0 for _ in members)
    return StackedImage(tuple(members), method, weights)
