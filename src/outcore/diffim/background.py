"""Sky background and its noise on a fixed mesh of boxes, the same whatever the tiling.

Each box of ``box x box`` pixels, aligned on the image's own grid (box ``(i, j)`` covers rows
``i * box ...`` and columns ``j * box ...``), gets its level and RMS: the 3-sigma clipped mean
and standard deviation (astropy) of its pixels, with masked pixels and the pixels of the
sources sep detects left out (so the mean is not biased by their light, and is less noisy
than a mode), the RMS divided by ``CLIPPED_RMS`` so that it estimates a Gaussian's sigma.
The boxes of the whole image form a small mesh; gaps (boxes with too few good pixels) are
filled from their neighbours, a 3 x 3 median filter removes boxes spoiled by bright sources,
and a bicubic spline through the box centres gives the background and RMS at any pixel.
Evaluating the spline at a pixel does not depend on which tile asks, so every tile of an
image sees the same background.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import sep
from astropy.stats import sigma_clip
from scipy.interpolate import BSpline, RectBivariateSpline
from scipy.ndimage import binary_dilation, median_filter

#: Box edge (pixels) of the background mesh when none is given.
DEFAULT_BOX = 64
#: A box whose good pixels are fewer than this fraction of its area gets its neighbours' level.
MIN_GOOD_FRACTION = 0.5
#: The clipped RMS is the standard deviation of the pixels within 3 sigma of the level, which
#: for Gaussian noise is this fraction of sigma (a normal truncated at +-3); the mesh divides
#: by it.
CLIPPED_RMS = math.sqrt(1 - 6 * math.exp(-4.5) / math.sqrt(2 * math.pi)
                        / math.erf(3 / math.sqrt(2)))
#: Sources are found at this many sigma (sep, 3 x 3 filter) and masked, grown by SOURCE_GROW
#: pixels, before the boxes are measured: their light would bias the level upwards.
SOURCE_SIGMA = 3.0
SOURCE_GROW = 4


@dataclass(frozen=True)
class Sky:
    """sep's local background of a window (boxes of ``DEFAULT_BOX`` px, 3 x 3 filter),
    measured once for the source mask and the star search: ``sub`` the window less it
    (C-contiguous float64, 0 at bad pixels before the subtraction), ``rms`` its global RMS."""

    sub: np.ndarray
    rms: float

    @classmethod
    def of(cls, data: np.ndarray, bad: np.ndarray) -> Sky | None:
        """The sky of ``data`` with ``bad`` pixels (True) left out; None when all are bad."""
        if bad.all():
            return None
        data = np.ascontiguousarray(np.where(bad, 0.0, data), dtype=np.float64)
        sky = sep.Background(data, mask=np.ascontiguousarray(bad), bw=DEFAULT_BOX,
                             bh=DEFAULT_BOX, fw=3, fh=3)
        data -= sky.back()
        return cls(data, sky.globalrms)


def source_mask(sky: Sky | None, bad: np.ndarray) -> np.ndarray:
    """Pixels covered by a source that sep detects at ``SOURCE_SIGMA`` in ``sky.sub``, grown
    by ``SOURCE_GROW`` pixels; ``bad`` pixels (True) are left out."""
    if sky is None:
        return np.zeros(bad.shape, dtype=bool)
    try:
        _, segments = sep.extract(sky.sub, SOURCE_SIGMA, err=sky.rms,
                                  mask=np.ascontiguousarray(bad), minarea=5,
                                  segmentation_map=True)
    except Exception:  # sep's pixel stack overflows: a block of sources; keep every pixel
        return np.zeros(bad.shape, dtype=bool)
    return binary_dilation(segments > 0, iterations=SOURCE_GROW)


def box_statistics(data: np.ndarray, bad: np.ndarray | None, box: int) -> tuple[np.ndarray,
                                                                                 np.ndarray]:
    """The 3-sigma clipped mean and RMS (astropy) of every box of ``data`` (a block whose
    origin lies on the box grid): two ``(ceil(ny / box), ceil(nx / box))`` float64 arrays,
    NaN where a box has too few good pixels (``bad`` True = ignored). The boxes are clipped
    all at once, as rows of one array (partial boxes at the far edges padded as bad)."""
    ny, nx = data.shape
    nby, nbx = -(-ny // box), -(-nx // box)
    pixels = np.full((nby * box, nbx * box), np.nan)
    pixels[:ny, :nx] = data if bad is None else np.where(bad, np.nan, data)
    area = np.zeros(pixels.shape)
    area[:ny, :nx] = 1.0

    def rows(a: np.ndarray) -> np.ndarray:
        return a.reshape(nby, box, nbx, box).transpose(0, 2, 1, 3).reshape(nby, nbx, box * box)

    pixels, area = rows(pixels), rows(area).sum(axis=-1)
    # bad pixels are masked rather than NaN and the empty boxes' means left to errstate, so
    # nothing warns: silencing warnings (catch_warnings) is not thread-safe, and tasks run in
    # threads. The clipped pixels come back as NaN; the sums are numpy's nanmean/nanstd's.
    clipped = sigma_clip(np.ma.masked_invalid(pixels), sigma=3.0, maxiters=5, axis=-1,
                         masked=False)
    good = np.isfinite(clipped)
    count = good.sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        back = np.where(good, clipped, 0.0).sum(axis=-1) / count
        deviation = np.where(good, clipped - back[..., None], 0.0)
        rms = np.sqrt((deviation * deviation).sum(axis=-1) / count) / CLIPPED_RMS
    few = np.isfinite(pixels).sum(axis=-1) < MIN_GOOD_FRACTION * area
    return np.where(few, np.nan, back), np.where(few, np.nan, rms)


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
        grown = np.ma.median(np.ma.masked_invalid(rings), axis=0).filled(np.nan)
        out = np.where(np.isnan(out), grown, out)
    return out


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
    box is made constant along it. The returned function evaluates it on the grid ``y x x``
    as ``B_y C B_x^T`` (``B`` scipy's sparse B-spline design matrices, ``C`` the spline's
    coefficients): fitpack's values to rounding in 40 % of its time, on one thread (a
    dense BLAS product is as fast on one thread but spins a thread per core in each tile)."""
    if yc.size == 1:
        yc, mesh = np.array([yc[0], yc[0] + 1.0]), np.vstack([mesh, mesh])
    if xc.size == 1:
        xc, mesh = np.array([xc[0], xc[0] + 1.0]), np.hstack([mesh, mesh])
    spline = RectBivariateSpline(yc, xc, mesh, kx=min(3, yc.size - 1), ky=min(3, xc.size - 1))
    (ty, tx, coefficients), (ky, kx) = spline.tck, spline.degrees
    c = coefficients.reshape(ty.size - ky - 1, tx.size - kx - 1)

    def on_grid(y: np.ndarray, x: np.ndarray) -> np.ndarray:
        rows = BSpline.design_matrix(y, ty, ky) @ c
        return np.ascontiguousarray((BSpline.design_matrix(x, tx, kx) @ rows.T).T)

    return on_grid
