"""Simulated ptychography scans with a known object and probe, written chunk by chunk.

The object is analytic: amplitude ``0.5 + 0.5 exp(-A)`` (0.5 to 1) and phase ``tanh(P)``
(-1 to 1 rad), where ``A`` and ``P`` are sums of Gaussian blobs (one per cell of a lattice,
different cells for the two, each cut at ``CUTOFF`` sigma). Any region of it is computed from
the blobs that reach it, so a task makes its own patch and the result is the same whatever
the chunking; a thick object has ``slices`` such objects ``slice_thickness`` apart. The
probe is a circular aperture of ``probe_aperture`` detector pixels with a defocus phase,
carried to the ``K x K`` window (``optics.pupil_to_probe``), or a given array; with
``probe_modes`` M > 1 the further modes are the same aperture moved by ``mode_tilt``
detector pixels (the tilted waves of an extended, incoherent source), each with
``mode_power`` of the first's power. Patterns are ``kernels.intensities`` of the complex64
truth (modes add intensities, slices are joined by Fresnel propagation), optionally Poisson
counts, and a detector ``mask`` sets the pixels it ignores to a wrong value (the pattern's
maximum) that only a masked reconstruction survives. Random draws depend on the seed and the
position index only: jitter comes from one stream for the whole scan, the errors of the
recorded positions from another, the noise of position ``j`` from the stream
``(seed, 0, j)``.

Positions follow the conventions of ``outcore.ptycho``: the window of position ``j`` has its
corner at ``coords[j]`` (row, col) in object pixels, fractional with ``subpixel`` jitter and
whole pixels otherwise (``top_left``, rounded), and its centre ``(coords + K / 2) *
pixel_size`` metres is the position (``xy`` order).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import Any

import dask.array as da
import distributed
import numpy as np
import xarray as xr

from outcore import io, session
from outcore.arguments import keywords_checked
from outcore.backend import nearest_whole
from outcore.checks import at_least
from outcore.errors import OutcoreError, refuse_existing
from outcore.io.store import open_unchecked, write_new
from outcore.plan import Plan, Resources
from outcore.ptycho.memory import PTYCHO_WORKER_BASELINE_BYTES, simulate_stages
from outcore.ptycho.optics import HC_EV_M, fresnel_propagator, pupil_to_probe
from outcore.ptycho.preprocessing.scan import CHUNK_POSITIONS
from outcore.ptycho.reconstruction.model import Model, intensities, warm

#: Energy [eV] and object pixel [m] when none are given.
DEFAULT_ENERGY_EV = 8000.0
DEFAULT_PIXEL_M = 1e-8
#: Gaussian blobs are cut at this many sigma (a pure function of the pixel either way).
CUTOFF = 4.0
#: ``outcore_layout`` attr of a truth store.
TRUTH_LAYOUT = "ptycho-truth"
_NOISE, _JITTER, _AMPLITUDE, _PHASE, _RECORDED = 0, 1, 2, 3, 4
_OBJECT_BLOCK_BYTES = 16 * 2**20


@dataclass(frozen=True)
class Blobs:
    """Gaussian blobs, rows of ``(row, col, sigma, weight)`` in object pixels (float64)."""

    table: np.ndarray

    def near(self, r0: int, r1: int, c0: int, c1: int) -> Blobs:
        """The blobs that reach rows ``r0:r1`` and columns ``c0:c1``."""
        row, col, sigma = self.table[:, 0], self.table[:, 1], self.table[:, 2]
        reach = CUTOFF * sigma
        keep = ((row + reach >= r0) & (row - reach < r1)
                & (col + reach >= c0) & (col - reach < c1))
        return Blobs(self.table[keep])

    def total(self, r0: int, r1: int, c0: int, c1: int) -> np.ndarray:
        """Their sum over rows ``r0:r1``, columns ``c0:c1`` (float64), blob by blob."""
        out = np.zeros((r1 - r0, c1 - c0))
        for row, col, sigma, weight in self.table:
            reach = CUTOFF * sigma
            a0, a1 = max(r0, math.ceil(row - reach)), min(r1, math.floor(row + reach) + 1)
            b0, b1 = max(c0, math.ceil(col - reach)), min(c1, math.floor(col + reach) + 1)
            if a0 >= a1 or b0 >= b1:
                continue
            dy = (np.arange(a0, a1) - row)[:, None] ** 2
            dx = (np.arange(b0, b1) - col)[None, :] ** 2
            r2 = dy + dx
            blob = np.where(r2 <= reach**2, np.exp(-r2 / (2 * sigma**2)), 0.0)
            out[a0 - r0:a1 - r0, b0 - c0:b1 - c0] += weight * blob
        return out


def lattice_blobs(shape: tuple[int, int], cell: int, weights: tuple[float, float],
                  rng: np.random.Generator) -> Blobs:
    """One blob per ``cell`` x ``cell`` cell: centre uniform in the cell, sigma from cell/6
    to cell/2.5, weight uniform in ``weights``."""
    rows, cols = (math.ceil(n / cell) for n in shape)
    u = rng.random((rows * cols, 4))
    iy, ix = np.divmod(np.arange(rows * cols), cols)
    table = np.column_stack([(iy + u[:, 0]) * cell, (ix + u[:, 1]) * cell,
                             cell * (1 / 6 + (1 / 2.5 - 1 / 6) * u[:, 2]),
                             weights[0] + (weights[1] - weights[0]) * u[:, 3]])
    return Blobs(table)


@dataclass(frozen=True)
class SyntheticObject:
    """The analytic object (Ny, Nx) complex64; slicing it computes only the slice asked for,
    so ``dask.array.from_array`` makes it block by block."""

    shape: tuple[int, int]
    amplitude: Blobs
    phase: Blobs

    dtype = np.dtype(np.complex64)
    ndim = 2

    def region(self, r0: int, r1: int, c0: int, c1: int) -> np.ndarray:
        """Object pixels ``[r0:r1, c0:c1]`` (complex64)."""
        amp = 0.5 + 0.5 * np.exp(-self.amplitude.near(r0, r1, c0, c1).total(r0, r1, c0, c1))
        phase = np.tanh(self.phase.near(r0, r1, c0, c1).total(r0, r1, c0, c1))
        return (amp * np.exp(1j * phase)).astype(np.complex64)

    def __getitem__(self, key: tuple[slice, slice]) -> np.ndarray:
        (r0, r1, _), (c0, c1, _) = (k.indices(n) for k, n in zip(key, self.shape, strict=True))
        return self.region(r0, r1, c0, c1)

    def to_dask(self) -> da.Array:
        """The whole object as a dask array of row bands of about 16 MiB."""
        rows = max(1, _OBJECT_BLOCK_BYTES // (self.shape[1] * self.dtype.itemsize))
        return da.from_array(self, chunks=(rows, -1), meta=np.empty((0, 0), self.dtype))


def synthetic_object(shape: tuple[int, int], k: int, seed: int, layer: int = 0,
                     detail: float = 1.0) -> SyntheticObject:
    """The object (slice ``layer``) of a scan with window ``k``: amplitude blobs on cells of
    ``k/2``, phase blobs on cells of ``3k/4`` pixels (different images by construction),
    both cells ``detail`` times smaller (at least 4 pixels)."""
    streams = [] if layer == 0 else [layer]
    amplitude = lattice_blobs(shape, max(4, int(k // 2 / detail)), (0.2, 2.0),
                              np.random.default_rng([seed, _AMPLITUDE, *streams]))
    phase = lattice_blobs(shape, max(4, int(3 * k // 4 / detail)), (-2.0, 2.0),
                          np.random.default_rng([seed, _PHASE, *streams]))
    return SyntheticObject(tuple(shape), amplitude, phase)  # type: ignore[arg-type]


def aperture_probe(k: int, aperture: float, wavelength: float, pixel_size: float,
                   defocus: float, centre: tuple[float, float] = (0.0, 0.0)) -> np.ndarray:
    """Probe (k, k) complex128 of unit energy: a pupil of radius ``aperture`` detector
    pixels around ``centre`` (q_y, q_x pixels from the zero frequency) with ``defocus`` [m]
    (see ``optics.pupil_to_probe``)."""
    q = np.arange(k) - k // 2
    pupil = (np.hypot(q[:, None] - centre[0], q[None, :] - centre[1]) <= aperture).astype(
        np.float64)
    probe = pupil_to_probe(pupil, wavelength, 1.0 / (k * pixel_size), defocus)
    return probe / np.sqrt((np.abs(probe) ** 2).sum())


def auto_defocus(k: int, aperture: float, wavelength: float, pixel_size: float) -> float:
    """Defocus [m] whose geometric probe radius ``wavelength * defocus * q_max`` is ``k/4``
    pixels (``q_max = aperture / (k * pixel_size)``)."""
    return k**2 * pixel_size**2 / (4 * wavelength * aperture)


def scan_coords(scan: tuple[int, int], step: float, jitter: float, seed: int,
                padding: int = 0, subpixel: bool = False) -> np.ndarray:
    """Window corners (NY*NX, 2) float64 (row, col), raster order: ``step`` pixels apart plus
    a uniform jitter in ``[-jitter, jitter]`` pixels per axis, rounded to whole pixels unless
    ``subpixel``, the smallest rounded row and column at ``padding``."""
    iy, ix = np.meshgrid(np.arange(scan[0]), np.arange(scan[1]), indexing="ij")
    nominal = np.stack([iy.ravel(), ix.ravel()], axis=1) * float(step)
    if jitter:
        rng = np.random.default_rng([seed, _JITTER])
        nominal = nominal + rng.uniform(-jitter, jitter, nominal.shape)
    rounded = np.floor(nominal + 0.5)
    coords = nominal if subpixel else rounded
    return coords - rounded.min(axis=0) + padding


def beam_stop(k: int, radius: float) -> np.ndarray:
    """A (k, k) detector mask, True on the disc of ``radius`` pixels around the zero
    frequency ``k // 2`` (a beam stop)."""
    if not (np.isfinite(radius) and 0 < radius < k / 2):
        raise OutcoreError(f"beam_stop={radius} is not a radius inside the {k}-pixel "
                           "detector.", f"give pixels between 0 and {k // 2}.")
    q = np.arange(k) - k // 2
    return np.hypot(q[:, None], q[None, :]) <= radius


def recorded_errors(n: int, error: float, seed: int) -> np.ndarray:
    """Errors (n, 2) of recorded positions, pixels: uniform in ``[-error, error]`` per axis,
    less their mean (a shift of every position is a shift of the object)."""
    if not error:
        return np.zeros((n, 2))
    draws = np.random.default_rng([seed, _RECORDED]).uniform(-error, error, (n, 2))
    return draws - draws.mean(axis=0)


@dataclass
class SimulatedFrames:
    """The diffraction patterns of a simulated scan as an array-like for
    ``dask.array.from_array``: slicing computes the patterns of those positions only.

    ``shape`` is ``(NY, NX, K, K)`` (grid) or ``(n, K, K)`` (list); ``coords`` (n, 2) in
    raster order; ``objects``: the slices; ``probe`` (M, K, K); ``noisy``: Poisson counts
    (the probe carries the dose); ``model``: the propagator between slices; ``mask``
    (K, K) True where the detector ignores a pixel.
    """

    shape: tuple[int, ...]
    dtype: np.dtype
    objects: tuple[SyntheticObject, ...]
    probe: np.ndarray
    coords: np.ndarray
    seed: int
    noisy: bool
    model: Model
    mask: np.ndarray | None = None

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __getitem__(self, key: tuple[slice, ...]) -> np.ndarray:
        scan = self.shape[:-2]
        index = np.arange(math.prod(scan)).reshape(scan)[key[:len(scan)]]
        frames = self.frames(index.ravel()).reshape(*index.shape, *self.shape[-2:])
        return frames[(Ellipsis, *key[len(scan):])]

    def frames(self, index: np.ndarray) -> np.ndarray:
        """Patterns (len(index), K, K) of the positions ``index`` (flat, raster order)."""
        k = self.shape[-1]
        if len(index) == 0:
            return np.empty((0, k, k), self.dtype)
        corners = self.coords[index]
        whole = nearest_whole(corners)
        r0, c0 = whole.min(axis=0)
        r1, c1 = whole.max(axis=0) + k
        patch = np.stack([o.region(int(r0), int(r1), int(c0), int(c1)) for o in self.objects])
        clean = intensities(patch, self.probe, corners - np.array([r0, c0]), self.model)
        if not self.noisy:
            out = clean.astype(self.dtype)
        else:
            out = np.empty(clean.shape, self.dtype)
            for i, j in enumerate(index):
                out[i] = np.random.default_rng([self.seed, _NOISE, int(j)]).poisson(clean[i])
        if self.mask is not None:
            out[:, self.mask] = out.max(axis=(1, 2))[:, None]
        return out


@dataclass(frozen=True)
class Simulation:
    """A simulated scan: ``stack`` (lazy ``diffraction`` dataset) and ``truth`` (object
    (y, x) or (slice, y, x) lazy complex64, probe (k_y, k_x) or (mode, k_y, k_x) complex64,
    top_left and the true positions per position)."""

    stack: xr.Dataset
    truth: xr.Dataset

    def plan(self, resources: Resources) -> Plan:
        """The memory plan of writing the scan on ``resources`` (nothing computed)."""
        return Plan.of(simulate_stages(self), resources,
                       baseline_bytes=PTYCHO_WORKER_BASELINE_BYTES)

    def save(self, output: str | PathLike[str], truth: str | PathLike[str] | None = None,
             *, client: distributed.Client | None = None, plan: Plan | None = None
             ) -> tuple[Path, Path]:
        """Write the stack at ``output`` and the truth at ``truth`` (default
        ``<output stem>.truth.zarr`` beside it), chunk by chunk, on ``client``
        (``outcore.session.client_for``); never overwrites. Its plan (``plan``, else this
        simulation's for the client's workers) is checked first: a worker memory limit too
        small is a ``PlanError`` before anything is written."""
        output = Path(output).expanduser()
        truth_path = Path(truth).expanduser() if truth else truth_path_for(output)
        refuse_existing(output)
        refuse_existing(truth_path)
        client = session.client_for(client)
        session.fitted_plan(self.plan, client, plan=plan, fixes=SIMULATE_FIXES)
        for var in self.truth.variables.values():
            var.encoding = {"compressors": None}
        with client.as_current():
            io.save(self.stack, output, layout="diffraction")
            write_new(self.truth, truth_path)
        return output, truth_path


#: What makes a simulation's tasks smaller, named when its plan does not fit.
SIMULATE_FIXES = ("simulate with a smaller chunk_positions= (positions per task)",)


def truth_path_for(output: str | PathLike[str]) -> Path:
    """``<stem>.truth.zarr`` beside the stack ``output``."""
    output = Path(output)
    return output.with_name(f"{output.stem}.truth.zarr")


def open_truth(path: str | PathLike[str]) -> xr.Dataset:
    """A truth store written by ``Simulation.save``, lazily."""
    ds = open_unchecked(path)
    if ds.attrs.get(io.LAYOUT_ATTR) != TRUTH_LAYOUT:
        raise OutcoreError(f"{str(path)!r} is not a simulation truth store.",
                           "open the .truth.zarr that Simulation.save (or ptycho simulate)"
                           " wrote beside the stack.")
    return ds


@keywords_checked
def simulate(
    scan: tuple[int, int] = (16, 16),
    *,
    step: float | None = None,
    jitter: float = 0.0,
    subpixel: bool = False,
    position_error: float = 0.0,
    detector: int = 64,
    energy: float | None = None,
    wavelength: float | None = None,
    pixel_size: float = DEFAULT_PIXEL_M,
    probe_aperture: float | None = None,
    defocus: float | None = None,
    probe: np.ndarray | str | PathLike | None = None,
    probe_modes: int = 1,
    mode_power: float = 0.5,
    mode_tilt: float = 2.0,
    slices: int = 1,
    slice_thickness: float | None = None,
    dose: float | None = None,
    mask: np.ndarray | None = None,
    object_detail: float = 1.0,
    dtype: Any = np.float32,
    seed: int = 0,
    chunk_positions: int = CHUNK_POSITIONS,
    object_padding: int = 0,
) -> Simulation:
    """A simulated ptychography scan with its truth; nothing is computed (``save`` writes
    both, on your cluster; ``.stack`` and ``.truth`` are lazy Datasets).

    ``scan`` (NY, NX) positions, ``step`` pixels apart (default ``detector // 8``), with a
    uniform ``jitter`` of up to that many pixels (whole pixels, or fractional with
    ``subpixel``; then a ``list`` layout with ``positions``; without jitter a ``grid`` with
    ``scan_step``). ``position_error``: the stack's recorded positions are off the true ones
    by a uniform draw of up to that many pixels per axis (zero mean; a list layout; the truth
    keeps the true ones). ``detector`` K pixels; ``energy`` [eV] or ``wavelength`` [m]
    (default 8 keV); ``pixel_size`` [m] of the object, so ``reciprocal_pixel_size = 1 / (K
    pixel_size)``. The probe is ``probe`` ((K, K) or (M, K, K) array or .npy), else an
    aperture of ``probe_aperture`` detector pixels (default K/4) with ``defocus`` [m]
    (default: a geometric radius of K/4 pixels), with ``probe_modes`` modes (see the module
    doc). ``slices`` objects ``slice_thickness`` metres apart. ``dose``: photons of the
    probe per pattern (all modes; the counts of a unit-transmission object), with Poisson
    noise; without it, noiseless intensities of a unit-energy probe. ``mask`` (K, K) bool:
    detector pixels to spoil and record as ignored. ``object_detail``: the object's blobs
    that many times smaller (more structure at the probe's scale, which position refinement
    needs). ``dtype`` float32 or uint32 (counts only). ``chunk_positions`` positions per
    task; ``object_padding`` pixels of object around the windows.
    """
    k = at_least(detector, "detector", 2)
    if len(scan) != 2:
        raise OutcoreError(f"scan={tuple(scan)} is not two sizes.",
                           "give the positions along y and x, e.g. scan=(16, 16).")
    if not all(isinstance(n, numbers.Integral) and n >= 1 for n in scan):
        raise OutcoreError(f"scan={tuple(scan)} is not two whole numbers of 1 or more.",
                           "give the positions along y and x, e.g. scan=(16, 16).")
    scan = (int(scan[0]), int(scan[1]))
    step = float(max(1, k // 8) if step is None else step)
    for value, name in ((step, "step"), (pixel_size, "pixel_size")):
        if not (np.isfinite(value) and value > 0):
            raise OutcoreError(f"{name}={value} must be positive.", f"give a positive {name}=.")
    if not (np.isfinite(object_detail) and object_detail >= 1):
        raise OutcoreError(f"object_detail={object_detail} must be 1 or more.",
                           "give 1 (the default) to 4.")
    for value, name in ((jitter, "jitter"), (position_error, "position_error")):
        if not (np.isfinite(value) and value >= 0):
            raise OutcoreError(f"{name}={value} must be 0 or more.", "give pixels, e.g. 1.5.")
    at_least(probe_modes, "probe_modes", what="1 or more probe modes")
    at_least(slices, "slices", what="1 or more slices")
    if (slices > 1) != (slice_thickness is not None) or (
            slice_thickness is not None and not slice_thickness > 0):
        raise OutcoreError(f"slices={slices} with slice_thickness={slice_thickness}: "
                           "a thickness goes with 2 or more slices, and they need one.",
                           "give both (e.g. slices=2 and slice_thickness=1e-6) or neither.")
    lam, radiation = _radiation(energy, wavelength)
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.uint32) or (dtype == np.uint32 and dose is None):
        raise OutcoreError(f"dtype={str(dtype)!r} is not float32, or uint32 with a dose.",
                           "use float32, or uint32 counts together with dose=.")
    if dose is not None and not (np.isfinite(dose) and dose > 0):
        raise OutcoreError(f"dose={dose} must be positive.", "give photons per pattern.")
    if mask is not None:
        mask = np.asarray(mask, bool)
        if mask.shape != (k, k):
            raise OutcoreError(f"The mask has shape {mask.shape}; the detector is {k}x{k}.",
                               f"give a ({k}, {k}) boolean mask.")
    aperture = float(probe_aperture if probe_aperture is not None else k / 4)
    if defocus is None:
        defocus = auto_defocus(k, aperture, lam, pixel_size)
    truth_probe = _probe(probe, k, aperture, lam, pixel_size, defocus, dose, probe_modes,
                         mode_power, mode_tilt)
    coords = scan_coords(scan, step, jitter, seed,
                         at_least(object_padding, "object_padding", 0), subpixel)
    top_left = nearest_whole(coords)
    shape = tuple(int(n) for n in top_left.max(axis=0) + k + object_padding)
    objects = tuple(synthetic_object(shape, k, seed, layer,  # type: ignore[arg-type]
                                     object_detail) for layer in range(slices))
    model = Model(propagator=None if slices == 1 else fresnel_propagator(
        k, pixel_size, lam, float(slice_thickness)))  # type: ignore[arg-type]
    grid = jitter == 0 and position_error == 0
    frame_shape = (*scan, k, k) if grid else (len(coords), k, k)
    source = SimulatedFrames(frame_shape, dtype, objects, truth_probe, coords, seed,
                             dose is not None, model, mask)
    n = at_least(chunk_positions, "chunk_positions", 1)
    chunks = ((max(1, n // min(n, scan[1])), min(n, scan[1])) if grid else (n,))
    data = da.from_array(source, chunks=(*chunks, k, k),
                         meta=np.empty((0,) * len(frame_shape), dtype))
    centres = (coords[:, ::-1] + k / 2) * pixel_size  # (x, y) metres
    recorded = centres + recorded_errors(len(coords), position_error, seed)[:, ::-1] * pixel_size
    attrs = {**radiation, "reciprocal_pixel_size": 1.0 / (k * pixel_size),
             "scan_step": step * pixel_size, "defocus": defocus, "probe_aperture": aperture,
             "seed": seed, "jitter": jitter, "subpixel": int(subpixel),
             "position_error": position_error, "probe_modes": probe_modes, "slices": slices,
             "object_detail": object_detail,
             "simulated": "outcore.ptycho.simulate"}
    if slices > 1:
        attrs["slice_thickness"] = float(slice_thickness)  # type: ignore[arg-type]
    if dose is not None:
        attrs["dose"] = dose
    variables: dict[str, Any] = {}
    if grid:
        variables["data"] = (("scan_y", "scan_x", "k_y", "k_x"), data)
    else:
        variables["data"] = (("position", "k_y", "k_x"), data)
        variables["positions"] = (("position", "xy"), recorded)
    if mask is not None:
        variables["mask"] = (("k_y", "k_x"), mask)
    stack = xr.Dataset(variables, coords={} if grid else {"xy": ["x", "y"]}, attrs=attrs)
    truth = _truth(objects, truth_probe, top_left, centres, pixel_size,
                   {**attrs, "wavelength": lam, "pixel_size": pixel_size, "detector_size": k,
                    "scan_shape": list(scan), "step": step, "object_padding": object_padding,
                    io.LAYOUT_ATTR: TRUTH_LAYOUT})
    warm()  # compile here once, so the workers load from numba's cache
    return Simulation(stack, truth)


def _radiation(energy: float | None, wavelength: float | None) -> tuple[float, dict]:
    """The wavelength [m] and the attr that states it (``energy`` or ``wavelength``)."""
    if energy is not None and wavelength is not None:
        raise OutcoreError("Both an energy and a wavelength were given.",
                           "give energy= (eV) or wavelength= (m), not both.")
    if wavelength is not None:
        if not (np.isfinite(wavelength) and wavelength > 0):
            raise OutcoreError(f"wavelength={wavelength} must be positive.",
                               "give metres, e.g. 1.55e-10.")
        return float(wavelength), {"wavelength": float(wavelength)}
    energy = DEFAULT_ENERGY_EV if energy is None else energy
    if not (np.isfinite(energy) and energy > 0):
        raise OutcoreError(f"energy={energy} must be positive.", "give eV, e.g. 8000.")
    return HC_EV_M / energy, {"energy": float(energy)}


def _probe(probe: np.ndarray | str | PathLike | None, k: int, aperture: float,
           wavelength: float, pixel_size: float, defocus: float, dose: float | None,
           modes: int, mode_power: float, tilt: float) -> np.ndarray:
    """The truth probe modes (M, k, k) complex64: given, or the aperture's (and its tilted
    copies); all modes together scaled to ``dose`` (else the aperture's to unit energy)."""
    if probe is None:
        tilts = [(0.0, 0.0), (tilt, 0.0), (0.0, tilt), (tilt, tilt), (-tilt, 0.0),
                 (0.0, -tilt), (-tilt, -tilt), (tilt, -tilt)]
        if modes > len(tilts):
            raise OutcoreError(f"probe_modes={modes} is more than the {len(tilts)} the "
                               "simulation makes.", f"give at most {len(tilts)}, or a probe=.")
        out = np.stack([aperture_probe(k, aperture, wavelength, pixel_size, defocus, shift)
                        * np.sqrt(1.0 if m == 0 else mode_power)
                        for m, shift in enumerate(tilts[:modes])])
    else:
        given = np.load(probe) if isinstance(probe, str | PathLike) else np.asarray(probe)
        out = given[None] if given.ndim == 2 else given
        if out.shape[-2:] != (k, k) or out.ndim != 3 or not np.isfinite(out).all():
            raise OutcoreError(f"The probe has shape {given.shape}; the detector is {k}x{k}.",
                               f"give a finite ({k}, {k}) (or (modes, {k}, {k})) complex "
                               f"probe, or detector={out.shape[-1]}.")
    if dose is not None or probe is None:  # a given probe keeps its power without a dose
        out = out * np.sqrt((dose or 1.0) / (np.abs(out) ** 2).sum())
    return out.astype(np.complex64)


def _truth(objects: tuple[SyntheticObject, ...], probe: np.ndarray, top_left: np.ndarray,
           centres: np.ndarray, pixel_size: float, attrs: dict) -> xr.Dataset:
    k = probe.shape[-1]
    offsets = (np.arange(k) - k // 2) * pixel_size
    obj = objects[0]
    layers = ((("y", "x"), obj.to_dask()) if len(objects) == 1 else
              (("slice", "y", "x"), da.stack([o.to_dask() for o in objects])))
    return xr.Dataset(
        {"object": layers,
         "probe": (("k_y", "k_x"), probe[0]) if len(probe) == 1 else
                  (("mode", "k_y", "k_x"), probe),
         "top_left": (("position", "yx"), top_left),
         "positions": (("position", "xy"), centres)},
        coords={"y": np.arange(obj.shape[0]) * pixel_size,
                "x": np.arange(obj.shape[1]) * pixel_size,
                "k_y": offsets, "k_x": offsets, "xy": ["x", "y"], "yx": ["y", "x"]},
        attrs=attrs,
    )
