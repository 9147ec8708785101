"""360-degree half-acquisition: opposite views of an offset-axis scan joined into full ones.

A parallel-beam scan over a full turn with the rotation axis near one edge of the detector
(offset axis, half acquisition) sees each half of the object in turn: the projection at
``theta + 180`` is, mirrored along ``u``, the part of the projection at ``theta`` that lies on
the other side of the axis. Stitching joins, for each view ``theta`` of ``[0, 180)``, the
projection at ``theta`` and the mirrored projection at ``theta + 180`` over the columns they
share (the *overlap*), blended linearly across it, into a projection of width
``2 * nu - ceil(overlap)`` that spans the axis on both sides: a half-turn scan of a field of
view twice as wide.

Conventions. The overlap ``o`` (pixels, fractional) is the width of the band of ``u`` that
both views see: with the axis at column ``c`` (0-based, fractional), ``o = 2 * nu - 1 - 2 c``
for an axis near the right edge (``right``: high columns) and ``o = 2 c + 1`` near the left
edge. The mirrored view is placed ``nu - o`` columns right (``right``) or left of the direct
one, shifted by the fractional part with a cubic spline. The stitched detector is laid out on
the direct view's columns, so the axis sits ``(ceil(o) - o) / 2`` pixel off its centre:
``detector_offset`` u becomes ``-(ceil(o) - o) / 2 * du`` (right) or ``+(ceil(o) - o) / 2 *
du`` (left), less than half a pixel and 0 for a whole overlap; the stored offset of the input
(the axis as far as anyone knew) is replaced by it.

Finding the overlap (``auto``): on a few pairs of opposite views (``REGISTER_PAIRS`` pairs,
``REGISTER_ROWS`` rows each), Lin's concordance of the direct view and the mirrored one over
the columns they share, for every whole shift at once (the products by FFT), then refined to
a fraction of a pixel by maximising it over the spline-shifted mirror within a column of the
best whole shift. The concordance, unlike a correlation, scores 1 only for equal values, so
smooth profiles that merely look alike and empty air at the far edges do not pass for an
overlap. This reads those view pairs when the step is configured (before the run's plan: the
stitched width depends on it), a small read in the client process.

Streaming: the view axis is cut so that block ``k`` of the first half and block ``k`` of the
second hold views ``i`` and ``i + n / 2``; one task holds one pair of blocks and writes one
stitched block. Cone beam is refused: opposite cone-beam views are not mirror images.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import dask.array as da
import numpy as np
import xarray as xr

from outcore.backend import whole_ceil
from outcore.errors import OutcoreError
from outcore.plan import Resources, TaskMemory
from outcore.tomo.corrections.correction import Step
from outcore.tomo.geometry import Geometry

SIDES: tuple[str, ...] = ("left", "right")
#: Fewest columns a found overlap may share (a narrower one is too few to correlate).
MIN_OVERLAP = 4
#: View pairs and detector rows that ``find_overlap`` reads.
REGISTER_PAIRS = 8
REGISTER_ROWS = 16
#: Scratch of a stitching task, in blocks of the input's size in float64 (the mirrored
#: view's spline coefficients and its shifted copy, the blend weights broadcast).
STITCH_SCRATCH_BLOCKS = 3


@dataclass(frozen=True)
class HalfAcquisition:
    """How opposite views join: ``overlap`` (pixels, fractional) and the axis' ``side``."""

    overlap: float
    side: str

    def width(self, nu: int) -> int:
        """Columns of the stitched projections for a detector of ``nu`` columns."""
        return 2 * nu - whole_ceil(self.overlap)

    def axis_column(self, nu: int) -> float:
        """The rotation axis' column on the input detector (0-based, fractional)."""
        c = (2 * nu - 1 - self.overlap) / 2
        return c if self.side == "right" else nu - 1 - c

    def offset(self, du: float) -> float:
        """``detector_offset`` u of the stitched detector (metres; less than half a pixel)."""
        half = (whole_ceil(self.overlap) - self.overlap) / 2
        return (-half if self.side == "right" else half) * du


def _shifted(x: np.ndarray, fraction: float) -> np.ndarray:
    """``x`` moved ``fraction`` (at most one) columns right along the last axis:
    ``out[..., i] = x(i - fraction)`` by a cubic spline along each row on its own (so a row
    does not depend on its neighbours, nor on the chunking); extrapolated past the ends."""
    if abs(fraction) < 1e-9:
        return x
    from scipy import interpolate

    n = x.shape[-1]
    spline = interpolate.make_interp_spline(np.arange(n), x, k=3, axis=x.ndim - 1)
    return spline(np.arange(n) - fraction)


def stitch_pair(direct: np.ndarray, opposite: np.ndarray, join: HalfAcquisition) -> np.ndarray:
    """Join views ``direct (..., nu)`` at ``theta`` and ``opposite (..., nu)`` at
    ``theta + 180`` into ``(..., join.width(nu))``, in the input's dtype."""
    if join.side == "left":  # mirror both, join as a right-side scan, mirror back
        return stitch_pair(direct[..., ::-1], opposite[..., ::-1],
                           HalfAcquisition(join.overlap, "right"))[..., ::-1]
    nu = direct.shape[-1]
    width = join.width(nu)
    start = nu - join.overlap  # where the mirrored view's column 0 lands
    whole = round(start)  # the nearest whole column, then a spline shift of at most 1/2
    mirrored = _shifted(opposite[..., ::-1].astype(np.float64), start - whole)
    j = np.arange(width)
    # the direct view's weight: 1 left of the overlap, 0 right of it, linear across it
    if nu - 1 - start > 1e-9:
        weight = np.clip((nu - 1 - j) / (nu - 1 - start), 0.0, 1.0)
    else:
        weight = (j <= nu - 1).astype(np.float64)
    out = np.zeros(direct.shape[:-1] + (width,), np.float64)
    out[..., :nu] = direct[..., : min(nu, width)] * weight[:nu]
    taken = np.clip(j - whole, 0, nu - 1)
    out += mirrored[..., taken] * (1.0 - weight)
    return out.astype(direct.dtype)


def check_scan(ds: xr.Dataset) -> Geometry:
    """The geometry of ``ds`` after refusing a scan that cannot be stitched (cone beam, not
    a full turn of evenly spaced views in an even number)."""
    geometry = Geometry.from_attrs(ds)
    if geometry.kind == "cone":
        raise OutcoreError("half-acquisition stitching is not done for cone-beam scans"
                           " (opposite cone-beam views are not mirror images, so they cannot"
                           " be stitched).",
                           "reconstruct the cone-beam scan without half_acquisition=.")
    angles = geometry.angles
    n = angles.size
    step = 2 * math.pi / n
    even = n % 2 == 0 and n >= 4
    if not even or not np.allclose(angles - angles[0], np.arange(n) * step, rtol=0,
                                   atol=1e-3 * step):
        span = math.degrees(angles[-1] - angles[0] + (angles[-1] - angles[0]) / max(n - 1, 1))
        raise OutcoreError(
            f"half_acquisition= needs a 360-degree scan: an even number of views evenly over "
            f"[0, 360) degrees, so that each view has its opposite; this scan has {n} views "
            f"over about {span:.1f} degrees.",
            "drop half_acquisition= (a 180-degree scan needs no stitching), or give the "
            "full-turn scan with its angles in increasing order.")
    return geometry


def _pairs(n_views: int, count: int) -> np.ndarray:
    """Up to ``count`` views of the first half, evenly spread."""
    half = n_views // 2
    return np.unique(np.linspace(0, half - 1, min(count, half)).round().astype(int))


def _rows(nv: int, count: int) -> np.ndarray:
    """Up to ``count`` detector rows, evenly spread, the outermost tenth left out."""
    lo, hi = int(nv * 0.1), max(int(nv * 0.1) + 1, nv - int(nv * 0.1))
    return np.unique(np.linspace(lo, hi - 1, min(count, hi - lo)).round().astype(int))


def _concordance(sa: Any, sb: Any, saa: Any, sbb: Any, sab: Any, count: Any) -> Any:
    """Lin's concordance ``2 cov / (var_a + var_b + (mean_a - mean_b)^2)`` from the sums of
    ``a, b, a^2, b^2, a b`` over ``count`` samples: 1 only where ``a == b``; 0 where both
    are constant and equal (empty air). Unlike a correlation it does not forgive a change of
    scale or level, which a wrong overlap of smooth profiles often is."""
    ma, mb = sa / count, sb / count
    covariance = sab / count - ma * mb
    spread = saa / count - ma**2 + sbb / count - mb**2 + (ma - mb) ** 2
    tiny = 1e-12 * (saa + sbb) / count + 1e-300
    return np.where(spread > tiny, 2 * covariance / np.maximum(spread, tiny), 0.0)


def _whole_shift_scores(direct: np.ndarray, mirrored: np.ndarray) -> np.ndarray:
    """The concordance of ``direct (k, nu)`` with ``mirrored`` moved ``s`` columns right, for
    ``s = -(nu - 1) .. nu - 1`` (index ``s + nu - 1``), over the ``k`` rows and the columns
    both cover; the products for every shift at once by FFT."""
    from scipy import signal

    k, nu = direct.shape
    product = signal.fftconvolve(direct, mirrored[:, ::-1], axes=-1).sum(axis=0)
    s = np.arange(-(nu - 1), nu)

    def window_sums(x: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        cumulative = np.concatenate([[0.0], np.cumsum(x.sum(axis=0))])
        return cumulative[hi] - cumulative[lo]

    a_lo, a_hi = np.maximum(s, 0), np.minimum(nu, nu + s)
    b_lo, b_hi = np.maximum(-s, 0), np.minimum(nu, nu - s)
    return _concordance(window_sums(direct, a_lo, a_hi), window_sums(mirrored, b_lo, b_hi),
                        window_sums(direct**2, a_lo, a_hi), window_sums(mirrored**2, b_lo, b_hi),
                        product, k * (nu - np.abs(s)))


def _scorer(direct: np.ndarray, mirrored: np.ndarray, lo: float, hi: float
            ) -> Callable[[float], float]:
    """The concordance of ``direct`` with ``mirrored`` moved by a fractional shift in
    ``[lo, hi]`` (a cubic spline of it), on the columns both cover for every such shift, so
    that the score is smooth in the shift."""
    from scipy import interpolate

    nu = direct.shape[-1]
    columns = np.arange(max(0, math.ceil(hi)), min(nu - 1, math.floor(nu - 1 + lo)) + 1)
    a = direct[:, columns]
    spline = interpolate.make_interp_spline(np.arange(nu), mirrored, k=3, axis=1)

    def score(shift: float) -> float:
        b = spline(columns - shift)
        return float(_concordance(a.sum(), b.sum(), (a * a).sum(), (b * b).sum(),
                                  (a * b).sum(), a.size))

    return score


def register(direct: np.ndarray, opposite: np.ndarray, side: str | None = None
             ) -> tuple[HalfAcquisition, float]:
    """The overlap of ``direct (k, nu)`` rows at ``theta`` and ``opposite`` rows at
    ``theta + 180`` (the same rows), and its concordance (1 for a perfect match).

    The best whole shift of the mirrored rows, then the fraction of a column that maximises
    the concordance around it. ``side`` restricts the search to an axis near that edge;
    None tries both.
    """
    from scipy import optimize

    a = np.asarray(direct, np.float64)
    mirrored = np.asarray(opposite, np.float64)[:, ::-1]
    nu = a.shape[-1]
    scores = _whole_shift_scores(a, mirrored)
    s = np.arange(-(nu - 1), nu)
    allowed = (np.abs(s) >= 1) & (np.abs(s) <= nu - MIN_OVERLAP)
    if side is not None:
        allowed &= s > 0 if side == "right" else s < 0
    if not allowed.any():
        raise OutcoreError(f"a detector of {nu} columns is too narrow to find an overlap.",
                           "give the overlap in pixels: half_acquisition=OVERLAP.")
    best = int(s[allowed][np.argmax(scores[allowed])])
    if scores[nu - 1] >= scores[best + nu - 1] and abs(best) <= 2:
        raise OutcoreError("opposite views match best with the axis at the detector centre: "
                           "this is a full-field 360-degree scan, not a half acquisition.",
                           "reconstruct it without half_acquisition=.")
    score = _scorer(a, mirrored, best - 1.0, best + 1.0)
    found = optimize.minimize_scalar(lambda x: -score(x), method="bounded",
                                     bounds=(best - 1.0, best + 1.0), options={"xatol": 1e-4})
    shift = float(found.x)
    return HalfAcquisition(nu - abs(shift), "right" if shift > 0 else "left"), -float(found.fun)


def _sample(projections: da.Array) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``(k, nu)`` of a few opposite view pairs of a 360-degree ``projections``
    (``REGISTER_PAIRS`` pairs, ``REGISTER_ROWS`` rows each), direct and opposite, float64;
    reads only those views."""
    n, nv, nu = projections.shape
    views, rows = _pairs(n, REGISTER_PAIRS), _rows(nv, REGISTER_ROWS)
    direct, opposite = da.compute(projections[views][:, rows],
                                  projections[views + n // 2][:, rows])
    return (np.asarray(direct, np.float64).reshape(-1, nu),
            np.asarray(opposite, np.float64).reshape(-1, nu))


def find_overlap(projections: da.Array, side: str | None = None
                 ) -> tuple[HalfAcquisition, float]:
    """``register`` on a few opposite view pairs of a 360-degree ``projections (view, v, u)``."""
    return register(*_sample(projections), side)


def _aligned(projections: da.Array) -> tuple[da.Array, da.Array]:
    """The two halves of the views, cut alike along ``view`` (block ``k`` of each holds
    views ``i`` and ``i + n / 2``), whole along ``u``."""
    n = projections.shape[0]
    half = n // 2
    per = max(1, min(max(projections.chunks[0]), half))
    chunks = (per, projections.chunks[1], -1)
    return (projections[:half].rechunk(chunks), projections[half:].rechunk(chunks))


def stitch(projections: da.Array, join: HalfAcquisition) -> da.Array:
    """Stitched ``(view / 2, v, width)`` projections of a 360-degree ``(view, v, u)`` scan,
    lazily, one pair of opposite view blocks per task."""
    first, second = _aligned(projections)
    width = join.width(projections.shape[-1])
    return da.map_blocks(stitch_pair, first, second, join, dtype=projections.dtype,
                         chunks=first.chunks[:2] + ((width,),),
                         meta=np.empty((0, 0, 0), projections.dtype))


@dataclass(frozen=True)
class Stitch:
    """The half-acquisition correction: ``join``, and the option it came from."""

    join: HalfAcquisition
    given: str
    found: bool
    concordance: float | None = None
    name: str = "stitch"
    moves_axis: bool = True

    def apply(self, ds: xr.Dataset) -> xr.Dataset:
        data = ds["projections"].data
        nv, nu = data.shape[1:]
        half = data.shape[0] // 2
        _, du = Geometry.from_attrs(ds).detector_pixel_size
        ov = list(np.ravel(ds.attrs.get("detector_offset", (0.0, 0.0))))
        ov = (ov * 2)[:2] if len(ov) == 1 else ov
        attrs = {**ds.attrs, "detector_offset": [float(ov[0]), self.join.offset(du)],
                 "half_acquisition": {"overlap": self.join.overlap, "axis_side": self.join.side,
                                      "input_columns": int(nu)}}
        return xr.Dataset({"projections": (("view", "v", "u"), stitch(data, self.join),
                                           ds["projections"].attrs)},
                          coords={"angles": ("view", np.asarray(ds["angles"].values[:half]),
                                             ds["angles"].attrs)},
                          attrs=attrs)

    def memory(self, ds: xr.Dataset) -> list[TaskMemory]:
        """A rechunk of the two halves to aligned blocks, then one task per pair of them."""
        data = ds["projections"].data
        first, _ = _aligned(data)
        item = data.dtype.itemsize
        block = max(first.chunks[0]) * max(first.chunks[1]) * data.shape[2]
        stored = math.prod(max(c) for c in data.chunks)
        width = self.join.width(data.shape[2])
        out = block // data.shape[2] * width
        tasks = len(first.chunks[0]) * len(first.chunks[1])
        return [TaskMemory("stitch-rechunk", tasks=2 * tasks, input_bytes=stored * item,
                           output_bytes=block * item),
                TaskMemory("stitch", tasks=tasks, input_bytes=2 * block * item,
                           output_bytes=out * item,
                           transient_bytes=STITCH_SCRATCH_BLOCKS * out * 8)]

    def record(self) -> dict[str, Any]:
        return {"half_acquisition": self.given, "overlap": round(self.join.overlap, 4),
                "axis_side": self.join.side, "found": self.found,
                "concordance": None if self.concordance is None else round(self.concordance, 6)}


def configure(ds: xr.Dataset, resources: Resources, half_acquisition: str | float = "auto",
              *, axis_side: str | None = None) -> Stitch:
    """The :class:`Stitch` of ``ds``: opposite views overlapping by ``half_acquisition``
    pixels, or found by registration (``"auto"``), with the axis near ``axis_side`` (found
    when None), checked before the stitch is computed (``auto`` reads a few view pairs)."""
    given = half_acquisition
    if axis_side is not None and axis_side not in SIDES:
        raise OutcoreError(f"axis_side={axis_side!r} is not one of {SIDES}.",
                           "pass axis_side='left' or 'right'.")
    overlap = None
    if given != "auto":
        try:
            overlap = float(given)
        except (TypeError, ValueError):
            raise OutcoreError(f"half_acquisition={given!r} is neither 'auto' nor a number of"
                               " pixels.", "pass half_acquisition='auto' or the overlap in"
                               " pixels, e.g. half_acquisition=120.") from None
    check_scan(ds)
    data = ds["projections"].data
    nu = data.shape[-1]
    if overlap is not None and not (0 <= overlap <= nu - 1):
        raise OutcoreError(f"half_acquisition={given!r}: the overlap must lie in [0, {nu - 1}]"
                           f" pixels (the detector has {nu} columns).",
                           "pass an overlap smaller than the detector, or 'auto'.")
    if overlap is None:
        join, concordance = find_overlap(data, axis_side)
        return Stitch(join, str(given), True, concordance)
    side = axis_side
    if side is None:
        left, right = (side_score(data, overlap, s) for s in SIDES)
        side = "right" if right >= left else "left"
    return Stitch(HalfAcquisition(overlap, side), str(given), False)


def side_score(projections: da.Array, overlap: float, side: str) -> float:
    """The concordance of opposite views of a 360-degree scan joined with ``overlap`` and the
    axis near ``side`` (the axis is near the side that scores higher)."""
    direct, opposite = _sample(projections)
    nu = direct.shape[-1]
    shift = (nu - overlap) * (1 if side == "right" else -1)
    return _scorer(direct, opposite[:, ::-1], shift, shift)(shift)


STEP = Step("stitch", lambda ds, resources, asked: configure(ds, resources, **asked))
