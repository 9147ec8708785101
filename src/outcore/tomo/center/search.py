"""The rotation centre of a parallel-beam scan, found on a few sinograms, sub-pixel.

The centre is the rotation axis' detector column in pixels, 0-based and fractional (the
tomopy/algotom convention). The geometry stores it as ``detector_offset`` u: a pixel's
centre sits at ``u = (iu - (nu - 1) / 2) * du + offset_u`` and the axis at ``u = 0``, so the
axis column is ``c = (nu - 1) / 2 - offset_u / du`` (:func:`offset_of`, :func:`center_of`).

Two methods, chosen by the scan's angular span:

- ``vo`` (half-turn scans): Vo's Fourier-space metric. For a trial centre ``c`` the sinogram
  over ``[0, pi)`` is followed by its mirror about ``c`` (the views ``theta + pi``), a full
  turn. At the right centre that full-turn sinogram is a real one, whose 2-D spectrum is
  nearly empty in the double wedge ``|p| > pi * ratio * |q|`` (angular harmonic ``p``,
  detector frequency index ``q``, object within ``ratio`` of the half-width); a wrong centre
  breaks it at the joins and fills the wedge (its share of the energy). A coarse search on a
  binned sinogram over half pixels is followed by a bounded scalar minimisation at full
  resolution (the mirror is shifted in Fourier space, so ``c`` is continuous).
- ``opposite`` (full-turn scans): registration of opposite projections. Each view at
  ``theta`` is paired with the view at ``theta + pi`` flipped along u, which is the first one
  shifted by ``d = 2 c - (nu - 1)``; the cross-power spectra of all pairs are summed, the
  whitened (phase) correlation gives the integer peak and the correlation, evaluated at a
  continuous shift, its sub-pixel maximum.

:func:`find_center` runs one task per sampled row on the cluster (each takes one sinogram,
``(view, u)``, never the stack; the file's blocks are read once for all rows), fits a tilt
(centre linear in the row) and refuses a scan whose centre cannot be found with a one-line
error that names the fix (``center=VALUE``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

import dask
import dask.array as da
import numpy as np
from scipy import fft as sfft

from outcore.backend import fft_indices
from outcore.errors import OutcoreError
from outcore.plan import TaskMemory

Method = Literal["vo", "opposite"]
METHODS: tuple[str, ...] = ("auto", "vo", "opposite")
#: Rows sampled along v when none are given.
DEFAULT_ROWS = 5
#: Vo's metric: the object's radius as a fraction of the detector's half width (1: it may
#: fill the field of view; smaller ratios bias the centre of a large object).
RATIO = 1.0
# How the wedge of Vo's metric was chosen: max / mean abs error (px) over sinograms with a
# known centre (the groups of benchmarks/bench_tomo_center.py, whose run gives the "used" and
# algotom rows; the others were measured on the same groups in one process, the discs with
# another draw of their noise; shepp48: the 48^3 projector scan of tests/test_tomo_center.py):
#                            rings128     discs512 2 %  phase256     shepp48
#   unweighted, q <= nu / 4  0.083/0.033  0.116/0.084   0.156/0.089  0.011/0.008  (used)
#   unweighted, every q      0.092/0.046  0.087/0.064   0.103/0.047  0.026/0.021
#   1 / q^2                  0.158/0.054  0.065/0.039   1.089/0.653  0.001
#   smoothed along views     0.101/0.044  0.026/0.012   0.758/0.535
#   algotom                  0.050/0.050  0.050/0.040   0.450/0.190
#: Coarse search: binned to at most this many columns and views.
COARSE_COLUMNS = 128
COARSE_VIEWS = 360
#: Fine stage: views decimated to at most this many.
FINE_VIEWS = 4000
#: A clear Vo minimum is this far below the median of the coarse curve (fraction of it):
#: scans measured 0.16 (phase contrast) to 1.0, uniform noise 0 in 80 draws (its minimum at
#: the edge of the search).
VO_CONTRAST = 0.1
#: A clear registration: the opposite views' correlation coefficient at the found shift.
MATCH = 0.5
#: A tilt is reported as significant when the fit moves the centre by this many pixels over
#: the detector's height.
TILT_PIXELS = 0.25
#: A row whose centre lies this many pixels off the line of the others (and three of their
#: robust spreads) is left out of the tilt fit: a spurious minimum, not a tilt. A real scan
#: showed one: a row of quality 0.62 eighteen pixels off, fitted as a "significant" tilt,
#: turned the volume against the truth (r -0.46).
OUTLIER_PIXELS = 1.0
FIX = "pass the centre yourself: center=VALUE, the axis column in pixels"
#: The mirror check: views looked at either side of where the stored angles put the mirror
#: of the first view, and the difference (in views) between that place and the projections'
#: own that makes a warning (the APS tooth's stored theta is off by one view at the end).
MIRROR_VIEWS = 3
MIRROR_WARN_VIEWS = 0.5
#: How the warning names the option that reads the angles from a file.
ANGLES_FILE = "angles='FILE'"


# --- conventions ------------------------------------------------------------------------------


def offset_of(center: float, nu: int, du: float) -> float:
    """``detector_offset`` u (length units) that puts the axis at column ``center``."""
    return ((nu - 1) / 2 - center) * du


def center_of(offset_u: float, nu: int, du: float) -> float:
    """The axis column of a detector of ``nu`` pixels of ``du`` shifted by ``offset_u``."""
    return (nu - 1) / 2 - offset_u / du


def check_center(center: float, nu: int, keyword: str = "center") -> float:
    """Refuse a centre outside the detector's columns ``[0, nu - 1]``."""
    if not math.isfinite(center) or not 0 <= center <= nu - 1:
        raise OutcoreError(f"{keyword}={center} is outside the detector (columns 0 to"
                           f" {nu - 1}).", f"give the axis column in pixels, from 0 to"
                           f" {nu - 1}, or {keyword}='auto' to find it.")
    return float(center)


def scan_method(angles: np.ndarray) -> Method:
    """``opposite`` for a full turn, ``vo`` for a half turn (radians); refuses a shorter scan."""
    angles = np.sort(np.asarray(angles, np.float64))
    step = float(np.median(np.diff(angles))) if angles.size > 1 else 0.0
    span = float(angles[-1] - angles[0]) + step
    if angles.size >= 4 and span >= 2 * math.pi - 1.5 * step:
        return "opposite"
    if angles.size >= 4 and span >= math.pi - 1.5 * step:
        return "vo"
    raise OutcoreError(f"the scan spans {math.degrees(span):.1f} degrees over {angles.size} "
                       "views; finding the centre needs a half turn at least.", FIX + ".")


def sample_rows(nv: int, count: int = DEFAULT_ROWS) -> list[int]:
    """``count`` distinct detector rows spread along v (inside its central 80 % when there
    is room, else over all of it)."""
    if nv <= count:
        return list(range(nv))
    for lo in (0.1, 0.0):
        rows = {round(r) for r in np.linspace(lo * (nv - 1), (1 - lo) * (nv - 1), count)}
        if len(rows) == count:
            break
    return sorted(rows)


# --- Vo's method (half turn) ------------------------------------------------------------------


class _Mirror:
    """The sinogram mirrored about a trial centre, shifted in Fourier space.

    ``sinogram (view, u)``; the flipped sinogram is padded with its edge values by ``pad``
    columns so that a shift of up to ``pad`` does not wrap the object round."""

    def __init__(self, sinogram: np.ndarray, pad: int) -> None:
        self.nu = sinogram.shape[1]
        self.pad = pad
        flipped = np.pad(sinogram[:, ::-1], ((0, 0), (pad, pad)), mode="edge")
        self.length = flipped.shape[1]
        self.spectrum = sfft.rfft(flipped, axis=1)
        self.k = np.arange(self.spectrum.shape[1])

    def about(self, center: float) -> np.ndarray:
        """``s(theta, 2 c - u)`` for ``u = 0 .. nu - 1``."""
        d = 2 * center - (self.nu - 1)
        phase = np.exp(-2j * np.pi * self.k * d / self.length)
        shifted = sfft.irfft(self.spectrum * phase, self.length, axis=1)
        return shifted[:, self.pad:self.pad + self.nu]


def _wedge(n_views: int, nu: int, ratio: float) -> np.ndarray:
    """The double wedge of a full-turn sinogram of ``2 n_views`` views, on the ``rfft2``
    grid: 1 where ``|p| > pi * ratio * q`` and ``2 <= q <= min(n_views / pi, nu / 4)``, else
    0. Column sums are left out, and so are the frequencies whose wedge the views undersample
    (an object filling the detector aliases there in angle) and the upper half of the
    detector's band, where its pixels' response and aliasing rather than the object lie (they
    biased a 48-column scan by 0.02 px).

    Unweighted: a weight of ``1 / q^2`` (against white noise) let the stripes of uneven
    detector gains and the fringes of phase contrast pull the centre by 0.16 and 1.1 px, and
    a smoothing along the views (against noise too) the fringes by 0.76 px (the table above
    ``COARSE_COLUMNS``)."""
    p = np.abs(fft_indices(2 * n_views))[:, None]  # integers: the edges are exact
    q = np.arange(nu // 2 + 1)[None, :]
    top = min(n_views / np.pi, nu / 4)
    return ((p > np.pi * ratio * q) & (q >= 2) & (q <= top)).astype(np.float64)


def _vo_metric(sinogram: np.ndarray, mirror: _Mirror, wedge: np.ndarray, center: float) -> float:
    """Energy of the full-turn sinogram of ``center`` in the wedge, per unit of its total
    energy."""
    full = np.concatenate([sinogram, mirror.about(center)])
    power = np.abs(sfft.rfft2(full)) ** 2
    return float((power * wedge).sum() / power.sum())


def _bin(sinogram: np.ndarray, columns: int, views: int) -> tuple[np.ndarray, int]:
    """The sinogram with its columns averaged by a factor b (to at most ``columns``) and its
    views decimated (to at most ``views``), and b."""
    n, nu = sinogram.shape
    b = max(1, math.ceil(nu / columns))
    step = max(1, math.ceil(n / views))
    cut = sinogram[::step, :nu - nu % b]
    return cut.reshape(cut.shape[0], -1, b).mean(axis=2), b


def center_vo(sinogram: np.ndarray, radius: float | None = None,
              ratio: float = RATIO) -> tuple[float, float]:
    """Centre (column) and contrast of a half-turn ``sinogram (view, u)`` by Vo's metric.

    ``radius``: pixels either side of the detector centre searched (default ``nu / 4``).
    The contrast is ``1 - min / median`` of the coarse curve (0 when the minimum sits at the
    edge of the search)."""
    n, nu = sinogram.shape
    radius = nu / 4 if radius is None else radius
    coarse, b = _bin(sinogram, COARSE_COLUMNS, COARSE_VIEWS)
    nb = coarse.shape[1]
    centre_b = (nb - 1) / 2
    trials = np.arange(-math.floor(2 * radius / b), math.floor(2 * radius / b) + 1) / 2
    mirror = _Mirror(coarse, math.ceil(2 * radius / b) + 2)
    wedge = _wedge(coarse.shape[0], nb, ratio)
    curve = np.array([_vo_metric(coarse, mirror, wedge, centre_b + t) for t in trials])
    best = int(np.argmin(curve))
    contrast = 0.0 if best in (0, len(trials) - 1) else 1 - curve[best] / np.median(curve)
    rough = (centre_b + trials[best]) * b + (b - 1) / 2
    fine = sinogram[::max(1, math.ceil(n / FINE_VIEWS))]
    mirror = _Mirror(fine, math.ceil(2 * (radius + b)) + 2)
    wedge = _wedge(fine.shape[0], nu, ratio)
    from scipy.optimize import minimize_scalar  # 0.2 s of import: only where a centre is sought

    found = minimize_scalar(lambda c: _vo_metric(fine, mirror, wedge, c),
                            bounds=(rough - b, rough + b), method="bounded",
                            options={"xatol": 1e-3})
    return float(found.x), float(contrast)


def half_turn(sinogram: np.ndarray, angles: np.ndarray) -> np.ndarray:
    """The views of ``sinogram (view, u)`` in the first half turn ``[theta_0, theta_0 + pi)``
    (to within half a step), in the order of their angles (radians)."""
    order = np.argsort(angles)
    ordered = np.asarray(angles, np.float64)[order]
    step = float(np.median(np.diff(ordered)))
    return sinogram[order[ordered < ordered[0] + np.pi - 0.5 * step]]


# --- the stored angles against the projections ----------------------------------------------


def mirror_view(sinogram: np.ndarray, angles: np.ndarray, center: float
                ) -> tuple[float, float] | None:
    """Where the first view's mirror lies among the views, as a fractional view index: as
    the projections say and as the stored ``angles`` (radians) say (past the last view, at
    the last step). The projections' place: the mirror (about each centre within 2 px of
    ``center``, 0.05 px apart) is fitted as ``(1 - t) v[k-1] + t v[k]`` for each pair of
    neighbouring views near the predicted place (``t`` from -1 to 2, so up to a view past
    either), and the best fit gives ``k - 1 + t``. None when the scan ends more than two
    steps short of half a turn from its first view, or no pair explains the mirror clearly
    (the best fit leaves more than half the mismatch of the mirror with the least like of
    the views looked at: the mirror is not among them)."""
    order = np.argsort(angles)
    ordered, views = np.asarray(angles, np.float64)[order], sinogram[order]
    n, nu = views.shape
    step = float(np.median(np.diff(ordered))) if n > 1 else 0.0
    target = ordered[0] + np.pi
    if n < 4 or step <= 0 or target > ordered[-1] + 2 * step:
        return None
    predicted = (float(np.interp(target, ordered, np.arange(n))) if target <= ordered[-1]
                 else (n - 1) + (target - ordered[-1]) / step)
    columns = np.arange(nu)
    mirrors = np.stack([np.interp(2 * c - columns, columns, views[0])
                        for c in center + np.linspace(-2, 2, 81)])
    best: tuple[float, float] | None = None  # residual, place
    worst = 0.0  # the largest mismatch of the mirror with a view looked at
    for k in range(max(1, math.floor(predicted) - MIRROR_VIEWS),
                   min(n, math.ceil(predicted) + MIRROR_VIEWS + 1)):
        before, change = views[k - 1], views[k] - views[k - 1]
        worst = max(worst, float(((mirrors - before) ** 2).sum(axis=1).min()))
        scale = float((change ** 2).sum())
        if scale <= 0:
            continue
        t = np.clip(((mirrors - before) * change).sum(axis=1) / scale, -1.0, 2.0)
        residual = ((mirrors - before - t[:, None] * change) ** 2).sum(axis=1)
        i = int(np.argmin(residual))
        if best is None or residual[i] < best[0]:
            best = (float(residual[i]), k - 1 + float(t[i]))
    if best is None or best[0] > 0.5 * worst:
        return None
    return best[1], predicted


def angles_warning(mirrors: list[tuple[float, float]], angles: np.ndarray) -> str | None:
    """A warning when the projections put the first view's mirror ``MIRROR_WARN_VIEWS`` or
    more from where the stored angles put it (the median over the rows' ``mirror_view``),
    with the step the projections imply; None when they agree."""
    if not mirrors:
        return None
    found, predicted = (float(np.median([m[i] for m in mirrors])) for i in (0, 1))
    if abs(found - predicted) < MIRROR_WARN_VIEWS or found <= 0:
        return None
    ordered = np.sort(np.degrees(np.asarray(angles, np.float64)))
    stored = float(np.median(np.diff(ordered)))
    return (f"the stored angles put the mirror of the first view at view {predicted:.2f}, the"
            f" projections at view {found:.2f}: the scan looks like {180 / found:.4f}-degree"
            f" steps, the file says {stored:.4f}. If the projections are right, give their"
            f" angles in a file (text or .npy, one angle a view) and read the scan with it:"
            f" {ANGLES_FILE}")


# --- registration of opposite projections (full turn) -----------------------------------------


def opposite_pairs(angles: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Indices ``(i, j)`` of the views with ``angles[j] = angles[i] + pi`` to within half a
    step (radians)."""
    angles = np.asarray(angles, np.float64)
    order = np.argsort(angles)
    ordered = angles[order]
    step = float(np.median(np.diff(ordered)))
    at = np.clip(np.searchsorted(ordered, ordered + np.pi), 1, len(ordered) - 1)
    nearer = np.where(np.abs(ordered[at - 1] - ordered - np.pi)
                      < np.abs(ordered[at] - ordered - np.pi), at - 1, at)
    good = np.abs(ordered[nearer] - ordered - np.pi) < 0.5 * step
    return order[good], order[nearer[good]]


def center_opposite(sinogram: np.ndarray, angles: np.ndarray) -> tuple[float, float]:
    """Centre (column) and match of a full-turn ``sinogram (view, u)``.

    The match is the correlation coefficient of the pairs at the found shift (their means
    left out): near 1 for a scan, near 0 for noise."""
    nu = sinogram.shape[1]
    first, second = opposite_pairs(angles)
    if first.size == 0:
        raise OutcoreError("the scan has no views half a turn apart.", FIX + ".")
    length = sfft.next_fast_len(2 * nu)
    pad = ((0, 0), (0, length - nu))
    a = sfft.rfft(np.pad(sinogram[first], pad, mode="edge"), axis=1)
    b = sfft.rfft(np.pad(sinogram[second][:, ::-1], pad, mode="edge"), axis=1)
    a[:, 0] = b[:, 0] = 0  # the means
    cross = (a * np.conj(b)).sum(axis=0)
    whitened = sfft.irfft(cross / np.maximum(np.abs(cross), 1e-12 * np.abs(cross).max()
                                             + 1e-300), length)
    peak = int(np.argmax(whitened))
    k = np.arange(cross.size)
    weights = np.where(k == length // 2, 1.0, 2.0)

    def correlation(s: float) -> float:
        return -float(np.real(weights * cross * np.exp(2j * np.pi * k * s / length)).sum())

    shift = peak if peak <= length // 2 else peak - length
    from scipy.optimize import minimize_scalar

    found = minimize_scalar(correlation, bounds=(shift - 1, shift + 1), method="bounded",
                            options={"xatol": 1e-3})
    energy = math.sqrt((weights * np.abs(a) ** 2).sum() * (weights * np.abs(b) ** 2).sum())
    match = -found.fun / energy if energy > 0 else 0.0
    return float((found.x + nu - 1) / 2), float(match)


# --- one row, many rows -----------------------------------------------------------------------


@dataclass(frozen=True)
class RowCenter:
    """The centre found on one sinogram: ``center`` in pixels (None when not found),
    ``quality`` (Vo: contrast; opposite: match), why it was not found or not used, and
    ``mirror``: where the first view's mirror lies, by the projections and by the stored
    angles (``mirror_view``)."""

    row: int
    center: float | None
    quality: float
    problem: str | None = None
    mirror: tuple[float, float] | None = None

    @property
    def used(self) -> bool:
        """Whether the row's centre counts: found, and not left out as disagreeing."""
        return self.center is not None and self.problem is None


def row_center(sinogram: np.ndarray, angles: np.ndarray, row: int, method: Method,
               radius: float | None = None) -> RowCenter:
    """The centre of one sinogram ``(view, u)``: a task of :func:`find_center`."""
    sinogram = np.asarray(sinogram, np.float64)
    if not np.isfinite(sinogram).all():
        return RowCenter(row, None, 0.0, "non-finite values")
    spread = float(np.ptp(sinogram))
    if spread <= 1e-6 * max(float(np.abs(sinogram).max()), 1e-30) or spread == 0:
        return RowCenter(row, None, 0.0, "flat sinogram (no object)")
    if method == "vo":
        center, quality = center_vo(half_turn(sinogram, angles), radius)
        clear = quality >= VO_CONTRAST
    else:
        center, quality = center_opposite(sinogram, angles)
        clear = quality >= MATCH
    if not clear:
        return RowCenter(row, None, quality, "no clear minimum" if method == "vo"
                         else "no clear correlation peak")
    return RowCenter(row, center, quality, mirror=mirror_view(sinogram, angles, center))


def _block_center(block: np.ndarray, angles: np.ndarray, row: int, method: Method,
                  radius: float | None) -> RowCenter:
    """:func:`row_center` of a chunk ``(view, 1, u)`` holding one row's sinogram."""
    return row_center(block[:, 0, :], angles, row, method, radius)


@dataclass(frozen=True)
class Tilt:
    """The centre as a line in the row: ``center(v) = intercept + slope * v`` (pixels);
    ``significant`` when it moves by ``TILT_PIXELS`` or more over the detector's height."""

    slope: float
    intercept: float
    angle_deg: float
    significant: bool


@dataclass(frozen=True)
class Center:
    """What :func:`find_center` found: the centre at the detector's middle row (from the
    tilt fit when there are two rows or more), the method, the rows and the fit, and a
    warning when the projections disagree with the stored angles (``angles_warning``)."""

    center: float
    method: Method
    rows: list[RowCenter]
    ranges: list[tuple[int, int]]
    tilt: Tilt | None
    detector_rows: int
    detector_columns: int
    angles_warning: str | None = None

    def record(self) -> dict[str, Any]:
        """``center.json``: the centre, the method, per slice range and the tilt."""
        found = {r.row: r for r in self.rows}
        return {
            "center": self.center, "method": self.method,
            "detector_shape": [self.detector_rows, self.detector_columns],
            "ranges": [{"rows": list(span), **asdict(found[row])}
                       for row, span in zip(sorted(found), self.ranges, strict=True)],
            "tilt": None if self.tilt is None else asdict(self.tilt),
            "angles_warning": self.angles_warning,
        }


def fit_tilt(rows: list[int], centers: list[float], nv: int,
             qualities: list[float] | None = None) -> Tilt | None:
    """The line of the centres against their rows, least squares weighted by each row's
    ``quality`` (None under two rows)."""
    if len(rows) < 2:
        return None
    weights = None if qualities is None else np.sqrt(np.clip(qualities, 1e-3, None))
    slope, intercept = np.polyfit(np.asarray(rows, np.float64), np.asarray(centers), 1,
                                  w=weights)
    return Tilt(float(slope), float(intercept), float(math.degrees(math.atan(slope))),
                bool(abs(slope) * max(nv - 1, 1) >= TILT_PIXELS))


def disagreeing(found: list[RowCenter]) -> set[int]:
    """The rows whose centres disagree with the others: from three rows on, those further
    than ``OUTLIER_PIXELS`` and three robust spreads (1.4826 MAD) from the line through the
    others, fitted on the rows' median first so that one spurious row cannot pull it."""
    if len(found) < 3:
        return set()
    rows = np.array([r.row for r in found], np.float64)
    centers = np.array([r.center for r in found], np.float64)
    kept = np.ones(rows.size, bool)
    line = np.full(rows.size, np.median(centers))
    for _ in range(3):  # the median, then the line through the rows kept, twice
        residual = np.abs(centers - line)
        spread = 1.4826 * np.median(residual[kept])
        now = residual <= max(OUTLIER_PIXELS, 3 * spread)
        if now.sum() < 2 or (now == kept).all():
            break
        kept = now
        if kept.sum() >= 3:
            slope, intercept = np.polyfit(rows[kept], centers[kept], 1)
            line = intercept + slope * rows
        else:
            line = np.full(rows.size, np.median(centers[kept]))
    return {r.row for r, keep in zip(found, kept, strict=True) if not keep}


def _ranges(rows: list[int], nv: int) -> list[tuple[int, int]]:
    """The slice range each sampled row stands for: the rows nearer it than its neighbours."""
    cuts = [0, *[(a + b + 1) // 2 for a, b in zip(rows, rows[1:], strict=False)], nv]
    return list(zip(cuts, cuts[1:], strict=False))


def find_center(projections: Any, angles: np.ndarray, client: Any = None,
                rows: list[int] | None = None, method: str = "auto",
                radius: float | None = None) -> Center:
    """The rotation centre of ``projections (view, v, u)`` (a dask, numpy or xarray array;
    only the sampled rows are read, one sinogram per task) over ``angles`` (radians).

    ``client``: a ``distributed.Client`` to compute on (None: dask's current scheduler).
    ``rows``: detector rows to use (default :func:`sample_rows`). ``method``: ``auto``
    (``opposite`` for a full turn, else ``vo``), ``vo`` or ``opposite``. Raises OutcoreError
    naming ``center=`` when no row gives a clear centre.
    """
    projections = da.asarray(getattr(projections, "data", projections))
    nview, nv, nu = projections.shape
    chosen: Method = scan_method(angles) if method == "auto" else method  # type: ignore
    if chosen == "opposite" and opposite_pairs(angles)[0].size == 0:
        raise OutcoreError("method='opposite' needs views half a turn apart; the scan "
                           "has none.", "use method='vo', or " + FIX + ".")
    rows = sample_rows(nv) if rows is None else sorted(set(rows))
    angles = np.asarray(angles, np.float64)
    # the sampled rows in one slice, one chunk per row, and their tasks from one graph: a
    # task per row slicing the stack itself read every block of the file once per row
    sinograms = projections[:, rows, :].rechunk((-1, 1, -1)).to_delayed().ravel()
    tasks = [dask.delayed(_block_center)(block, angles, row, chosen, radius)
             for block, row in zip(sinograms, rows, strict=True)]
    if client is None:
        found = list(dask.compute(*tasks))
    else:
        found = client.gather(client.compute(tasks))
    good = [r for r in found if r.center is not None]
    if not good:
        problems = "; ".join(f"row {r.row}: {r.problem}" for r in found)
        raise OutcoreError(f"the rotation centre cannot be found ({chosen} method; {problems}).",
                           FIX + ".")
    odd = disagreeing(good)
    if odd:
        median = float(np.median([r.center for r in good if r.row not in odd]))
        found = [replace(r, problem=f"disagrees with the other rows ({r.center - median:+.2f}"
                         " px from their median): left out") if r.row in odd else r
                 for r in found]
        good = [r for r in good if r.row not in odd]
    tilt = fit_tilt([r.row for r in good], [r.center for r in good], nv,
                    [r.quality for r in good])
    middle = (nv - 1) / 2
    center = good[0].center if tilt is None else tilt.intercept + tilt.slope * middle
    warning = angles_warning([r.mirror for r in good if r.mirror is not None], angles)
    return Center(float(center), chosen, found, _ranges(rows, nv), tilt, nv, nu, warning)


def memory(n_views: int, nu: int, rows: int = DEFAULT_ROWS) -> TaskMemory:
    """The plan's stage of :func:`find_center`: one sinogram per task, in float64, with the
    full-turn sinogram's spectrum and the padded mirror (about 12 copies at the peak)."""
    sinogram = n_views * nu * 8
    return TaskMemory("find-center", rows, input_bytes=n_views * nu * 4, output_bytes=64,
                      transient_bytes=12 * sinogram)
