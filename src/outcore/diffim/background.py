"""Sky background and its noise on a fixed mesh of boxes, the same whatever the tiling.

Each box of ``box x box`` pixels, aligned on the image's own grid (box ``(i, j)`` covers rows
``i * box ...`` and columns ``j * box ...``), gets sep's SExtractor estimate of its level and
RMS (clipped mode and standard deviation, masked pixels left out). The boxes of the whole
image form a small mesh; gaps (boxes with too few good pixels) are filled from their
neighbours, a 3 x 3 median filter removes boxes spoiled by bright sources, and a bicubic
spline through the box centres gives the background and RMS at any pixel. Evaluating the
spline at a pixel does not depend on which tile asks, so every tile of an image sees the
same background.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import sep
from scipy.interpolate import RectBivariateSpline
from scipy.ndimage import median_filter

#: Box edge (pixels) of the background mesh when none is given.
DEFAULT_BOX = 64
#: A box whose good pixels are fewer than this fraction of its area gets its neighbours' level.
MIN_GOOD_FRACTION = 0.5


def box_statistics(data: np.ndarray, bad: np.ndarray | None, box: int) -> tuple[np.ndarray,
                                                                                 np.ndarray]:
    """sep's background level and RMS of every box of ``data`` (a block whose origin lies on
    the box grid): two ``(ceil(ny / box), ceil(nx / box))`` float64 arrays, NaN where a box
    has too few good pixels (``bad`` True = ignored)."""
    ny, nx = data.shape
    nby, nbx = -(-ny // box), -(-nx // box)
    back = np.full((nby, nbx), np.nan)
    rms = np.full((nby, nbx), np.nan)
    for i in range(nby):
        for j in range(nbx):
            cut = np.s_[i * box: (i + 1) * box, j * box: (j + 1) * box]
            pixels = np.ascontiguousarray(data[cut], dtype=np.float64)
            mask = None if bad is None else np.ascontiguousarray(bad[cut])
            good = pixels.size if mask is None else pixels.size - int(mask.sum())
            if good < MIN_GOOD_FRACTION * pixels.size:
                continue
            h, w = pixels.shape
            estimate = sep.Background(pixels, mask=mask, bw=w, bh=h, fw=1, fh=1)
            back[i, j], rms[i, j] = estimate.globalback, estimate.globalrms
    return back, rms


def fill_gaps(mesh: np.ndarray) -> np.ndarray:
    """``mesh`` with NaN boxes set to the median of their nearest good boxes (growing rings);
    an all-NaN mesh stays NaN."""
    out = mesh.copy()
    if np.isnan(out).all():
        return out
    while np.isnan(out).any():
        padded = np.pad(out, 1, constant_values=np.nan)
        rings = np.stack([padded[1 + dy: padded.shape[0] - 1 + dy,
                                 1 + dx: padded.shape[1] - 1 + dx]
                          for dy in (-1, 0, 1) for dx in (-1, 0, 1)])
        with np.errstate(all="ignore"), _quiet():
            grown = np.nanmedian(rings, axis=0)
        out = np.where(np.isnan(out), grown, out)
    return out


class _quiet:
    """Silence numpy's all-NaN slice warning inside ``fill_gaps``."""

    def __enter__(self) -> None:
        import warnings

        self._catch = warnings.catch_warnings()
        self._catch.__enter__()
        warnings.simplefilter("ignore", RuntimeWarning)

    def __exit__(self, *exc: object) -> None:
        self._catch.__exit__(*exc)


@dataclass(frozen=True)
class BackgroundMesh:
    """The background and RMS mesh of one image of ``shape``, boxes of ``box`` pixels."""

    shape: tuple[int, int]
    box: int
    back: np.ndarray
    rms: np.ndarray

    @classmethod
    def from_boxes(cls, shape: tuple[int, int], box: int, back: np.ndarray,
                   rms: np.ndarray) -> BackgroundMesh:
        """Fill gaps and median-filter (3 x 3) the raw box estimates of a whole image."""
        back = median_filter(fill_gaps(back), size=3, mode="nearest")
        rms = median_filter(fill_gaps(rms), size=3, mode="nearest")
        return cls(shape, box, back, rms)

    @property
    def sigma(self) -> float:
        """The image's typical background noise: the median RMS of its boxes."""
        return float(np.median(self.rms))

    def _centres(self, axis: int) -> np.ndarray:
        n = self.shape[axis]
        start = np.arange(0, n, self.box)
        return start + (np.minimum(start + self.box, n) - start - 1) / 2

    def evaluate(self, y0: int, y1: int, x0: int, x1: int) -> tuple[np.ndarray, np.ndarray]:
        """Background and RMS at pixels ``[y0:y1, x0:x1]`` (inside the image), float64: a
        bicubic spline through the box centres, constant beyond the outermost centres."""
        yc, xc = self._centres(0), self._centres(1)
        y = np.clip(np.arange(y0, y1, dtype=np.float64), yc[0], yc[-1])
        x = np.clip(np.arange(x0, x1, dtype=np.float64), xc[0], xc[-1])
        return (_spline(yc, xc, self.back)(y, x), _spline(yc, xc, self.rms)(y, x))


def _spline(yc: np.ndarray, xc: np.ndarray, mesh: np.ndarray):  # noqa: ANN202
    """A bicubic (or lower, with few boxes) interpolating spline of ``mesh``; an axis with one
    box is made constant along it."""
    if yc.size == 1:
        yc, mesh = np.array([yc[0], yc[0] + 1.0]), np.vstack([mesh, mesh])
    if xc.size == 1:
        xc, mesh = np.array([xc[0], xc[0] + 1.0]), np.hstack([mesh, mesh])
    spline = RectBivariateSpline(yc, xc, mesh, kx=min(3, yc.size - 1), ky=min(3, xc.size - 1))
    return lambda y, x: spline(y, x, grid=True)
