"""Simulated ptychography scans with a known object and probe, written chunk by chunk.

The object is analytic: amplitude ``0.5 + 0.5 exp(-A)`` (0.5 to 1) and phase ``tanh(P)``
(-1 to 1 rad), where ``A`` and ``P`` are sums of Gaussian blobs (one per cell of a lattice,
different cells for the two, each cut at ``CUTOFF`` sigma). Any region of it is computed from
the blobs that reach it, so a task makes its own patch and the result is the same whatever
the chunking. The probe is a circular aperture of ``probe_aperture`` detector pixels with
a defocus phase, carried to the ``K x K`` window (``optics.pupil_to_probe``), or a given
array. Patterns are ``kernels.intensities`` of the complex64 truth, optionally Poisson
counts. Random draws depend on the seed and the position index only: jitter comes from one
stream for the whole scan, the noise of position ``j`` from the stream ``(seed, 0, j)``.

Positions follow the conventions of ``outcore.ptycho``: the window of position ``j`` has its
corner at ``top_left[j]`` (row, col) in object pixels, and its centre
``(top_left + K / 2) * pixel_size`` metres is the position (``xy`` order).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import Any

import dask.array as da
import numpy as np
import xarray as xr

from outcore import io
from outcore.checks import at_least
from outcore.errors import OutcoreError, refuse_existing
from outcore.io.store import open_unchecked
from outcore.ptycho.kernels import intensities
from outcore.ptycho.optics import HC_EV_M, pupil_to_probe
from outcore.ptycho.scan import CHUNK_POSITIONS
from outcore.ptycho.store import write_store

#: Energy [eV] and object pixel [m] when none are given.
DEFAULT_ENERGY_EV = 8000.0
DEFAULT_PIXEL_M = 1e-8
#: Gaussian blobs are cut at this many sigma (a pure function of the pixel either way).
CUTOFF = 4.0
#: ``outcore_layout`` attr of a truth store.
TRUTH_LAYOUT = "ptycho-truth"
_NOISE, _JITTER, _AMPLITUDE, _PHASE = 0, 1, 2, 3
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


def synthetic_object(shape: tuple[int, int], k: int, seed: int) -> SyntheticObject:
    """The object of a scan with window ``k``: amplitude blobs on cells of ``k/2``, phase
    blobs on cells of ``3k/4`` pixels (different images by construction)."""
    amplitude = lattice_blobs(shape, max(4, k // 2), (0.2, 2.0),
                              np.random.default_rng([seed, _AMPLITUDE]))
    phase = lattice_blobs(shape, max(4, 3 * k // 4), (-2.0, 2.0),
                          np.random.default_rng([seed, _PHASE]))
    return SyntheticObject(tuple(shape), amplitude, phase)  # type: ignore[arg-type]


def aperture_probe(k: int, aperture: float, wavelength: float, pixel_size: float,
                   defocus: float) -> np.ndarray:
    """Probe (k, k) complex128 of unit energy: a pupil of radius ``aperture`` detector
    pixels with ``defocus`` [m] (see ``optics.pupil_to_probe``)."""
    q = np.arange(k) - k // 2
    pupil = (np.hypot(q[:, None], q[None, :]) <= aperture).astype(np.float64)
    probe = pupil_to_probe(pupil, wavelength, 1.0 / (k * pixel_size), defocus)
    return probe / np.sqrt((np.abs(probe) ** 2).sum())


def auto_defocus(k: int, aperture: float, wavelength: float, pixel_size: float) -> float:
    """Defocus [m] whose geometric probe radius ``wavelength * defocus * q_max`` is ``k/4``
    pixels (``q_max = aperture / (k * pixel_size)``)."""
    return k**2 * pixel_size**2 / (4 * wavelength * aperture)


def scan_top_left(scan: tuple[int, int], step: float, jitter: float, seed: int,
                  padding: int = 0) -> np.ndarray:
    """Window corners (NY*NX, 2) int64 (row, col), raster order: ``step`` pixels apart plus
    a uniform jitter in ``[-jitter, jitter]`` pixels per axis, rounded, the smallest row and
    column at ``padding``."""
    iy, ix = np.meshgrid(np.arange(scan[0]), np.arange(scan[1]), indexing="ij")
    nominal = np.stack([iy.ravel(), ix.ravel()], axis=1) * float(step)
    if jitter:
        rng = np.random.default_rng([seed, _JITTER])
        nominal = nominal + rng.uniform(-jitter, jitter, nominal.shape)
    top_left = np.floor(nominal + 0.5).astype(np.int64)
    return top_left - top_left.min(axis=0) + padding


@dataclass
class SimulatedFrames:
    """The diffraction patterns of a simulated scan as an array-like for
    ``dask.array.from_array``: slicing computes the patterns of those positions only.

    ``shape`` is ``(NY, NX, K, K)`` (grid) or ``(n, K, K)`` (list); ``top_left`` (n, 2) in
    raster order; ``noisy``: Poisson counts (the probe carries the dose).
    """

    shape: tuple[int, ...]
    dtype: np.dtype
    obj: SyntheticObject
    probe: np.ndarray
    top_left: np.ndarray
    seed: int
    noisy: bool

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
        corners = self.top_left[index]
        r0, c0 = corners.min(axis=0)
        r1, c1 = corners.max(axis=0) + k
        patch = self.obj.region(int(r0), int(r1), int(c0), int(c1))
        clean = intensities(patch, self.probe, corners - np.array([r0, c0]))
        if not self.noisy:
            return clean.astype(self.dtype)
        out = np.empty(clean.shape, self.dtype)
        for i, j in enumerate(index):
            out[i] = np.random.default_rng([self.seed, _NOISE, int(j)]).poisson(clean[i])
        return out


@dataclass(frozen=True)
class Simulation:
    """A simulated scan: ``stack`` (lazy ``diffraction`` dataset) and ``truth`` (object
    (y, x) lazy complex64, probe (k_y, k_x) complex64, top_left and positions per position)."""

    stack: xr.Dataset
    truth: xr.Dataset

    def save(self, output: str | PathLike[str], truth: str | PathLike[str] | None = None
             ) -> tuple[Path, Path]:
        """Write the stack at ``output`` and the truth at ``truth`` (default
        ``<output stem>.truth.zarr`` beside it), chunk by chunk; never overwrites."""
        output = Path(output).expanduser()
        truth_path = Path(truth).expanduser() if truth else truth_path_for(output)
        refuse_existing(output)
        refuse_existing(truth_path)
        io.save(self.stack, output, layout="diffraction")
        for var in self.truth.variables.values():
            var.encoding = {"compressors": None}
        write_store(self.truth, truth_path)
        return output, truth_path


def truth_path_for(output: str | PathLike[str]) -> Path:
    """``<stem>.truth.zarr`` beside the stack ``output``."""
    output = Path(output)
    return output.with_name(f"{output.stem}.truth.zarr")


def open_truth(path: str | PathLike[str]) -> xr.Dataset:
    """A truth store written by ``Simulation.save``, lazily."""
    ds = open_unchecked(path)
    if ds.attrs.get(io.LAYOUT_ATTR) != TRUTH_LAYOUT:
        raise OutcoreError(f"{str(path)!r} is not a simulation truth store.",
                           "open the .truth.zarr written by outcore ptycho simulate.")
    return ds


def simulate_stack(
    scan: tuple[int, int] = (16, 16),
    *,
    step: float | None = None,
    jitter: float = 0.0,
    detector: int = 64,
    energy: float | None = None,
    wavelength: float | None = None,
    pixel_size: float = DEFAULT_PIXEL_M,
    probe_aperture: float | None = None,
    defocus: float | None = None,
    probe: np.ndarray | str | PathLike | None = None,
    dose: float | None = None,
    dtype: Any = np.float32,
    seed: int = 0,
    chunk_positions: int = CHUNK_POSITIONS,
    object_padding: int = 0,
) -> Simulation:
    """A simulated ptychography scan with its truth; nothing is computed yet.

    ``scan`` (NY, NX) positions, ``step`` pixels apart (default ``detector // 8``), with a
    uniform ``jitter`` of up to that many pixels (then a ``list`` layout with
    ``positions``; without jitter a ``grid`` with ``scan_step``). ``detector`` K pixels;
    ``energy`` [eV] or ``wavelength`` [m] (default 8 keV); ``pixel_size`` [m] of the object,
    so ``reciprocal_pixel_size = 1 / (K pixel_size)``. The probe is ``probe`` ((K, K) array
    or .npy), else an aperture of ``probe_aperture`` detector pixels (default K/4) with
    ``defocus`` [m] (default: a geometric radius of K/4 pixels). ``dose``: photons of the
    probe per pattern (the counts of a unit-transmission object), with Poisson noise;
    without it, noiseless intensities of a unit-energy probe. ``dtype`` float32 or uint32
    (counts only). ``chunk_positions`` positions per task; ``object_padding`` pixels of
    object around the windows.
    """
    k = at_least(detector, "--detector", 2)
    scan = (at_least(scan[0], "--scan", 1), at_least(scan[1], "--scan", 1))
    step = float(max(1, k // 8) if step is None else step)
    for value, flag in ((step, "--step"), (pixel_size, "--pixel-size")):
        if not (np.isfinite(value) and value > 0):
            raise OutcoreError(f"{flag} {value} must be positive.", f"give a positive {flag}.")
    if not (np.isfinite(jitter) and jitter >= 0):
        raise OutcoreError(f"--jitter {jitter} must be 0 or more.", "give pixels, e.g. 1.5.")
    lam, radiation = _radiation(energy, wavelength)
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.uint32) or (dtype == np.uint32 and dose is None):
        raise OutcoreError(f"dtype {dtype} is not float32, or uint32 with a dose.",
                           "use float32, or uint32 counts together with --dose.")
    if dose is not None and not (np.isfinite(dose) and dose > 0):
        raise OutcoreError(f"--dose {dose} must be positive.", "give photons per pattern.")
    aperture = float(probe_aperture if probe_aperture is not None else k / 4)
    if defocus is None:
        defocus = auto_defocus(k, aperture, lam, pixel_size)
    truth_probe = _probe(probe, k, aperture, lam, pixel_size, defocus, dose)
    top_left = scan_top_left(scan, step, jitter, seed, at_least(object_padding,
                                                                 "--object-padding", 0))
    shape = tuple(int(n) for n in top_left.max(axis=0) + k + object_padding)
    obj = synthetic_object(shape, k, seed)  # type: ignore[arg-type]
    grid = jitter == 0
    frame_shape = (*scan, k, k) if grid else (len(top_left), k, k)
    source = SimulatedFrames(frame_shape, dtype, obj, truth_probe, top_left, seed,
                             dose is not None)
    n = at_least(chunk_positions, "--chunk-positions", 1)
    chunks = ((max(1, n // min(n, scan[1])), min(n, scan[1])) if grid else (n,))
    data = da.from_array(source, chunks=(*chunks, k, k),
                         meta=np.empty((0,) * len(frame_shape), dtype))
    centres = (top_left[:, ::-1] + k / 2) * pixel_size  # (x, y) metres
    attrs = {**radiation, "reciprocal_pixel_size": 1.0 / (k * pixel_size),
             "scan_step": step * pixel_size, "defocus": defocus, "probe_aperture": aperture,
             "seed": seed, "jitter": jitter, "simulated": "outcore.ptycho.simulate"}
    if dose is not None:
        attrs["dose"] = dose
    if grid:
        stack = xr.Dataset({"data": (("scan_y", "scan_x", "k_y", "k_x"), data)}, attrs=attrs)
    else:
        stack = xr.Dataset({"data": (("position", "k_y", "k_x"), data),
                            "positions": (("position", "xy"), centres)},
                           coords={"xy": ["x", "y"]}, attrs=attrs)
    truth = _truth(obj, truth_probe, top_left, centres, pixel_size,
                   {**attrs, "wavelength": lam, "pixel_size": pixel_size, "detector_size": k,
                    "scan_shape": list(scan), "step": step, "object_padding": object_padding,
                    io.LAYOUT_ATTR: TRUTH_LAYOUT})
    return Simulation(stack, truth)


def _radiation(energy: float | None, wavelength: float | None) -> tuple[float, dict]:
    """The wavelength [m] and the attr that states it (``energy`` or ``wavelength``)."""
    if energy is not None and wavelength is not None:
        raise OutcoreError("Both an energy and a wavelength were given.",
                           "give --energy EV or --wavelength M, not both.")
    if wavelength is not None:
        if not (np.isfinite(wavelength) and wavelength > 0):
            raise OutcoreError(f"--wavelength {wavelength} must be positive.",
                               "give metres, e.g. 1.55e-10.")
        return float(wavelength), {"wavelength": float(wavelength)}
    energy = DEFAULT_ENERGY_EV if energy is None else energy
    if not (np.isfinite(energy) and energy > 0):
        raise OutcoreError(f"--energy {energy} must be positive.", "give eV, e.g. 8000.")
    return HC_EV_M / energy, {"energy": float(energy)}


def _probe(probe: np.ndarray | str | PathLike | None, k: int, aperture: float,
           wavelength: float, pixel_size: float, defocus: float, dose: float | None
           ) -> np.ndarray:
    """The truth probe (k, k) complex64: given, or the aperture's; scaled to ``dose``."""
    if probe is None:
        out = aperture_probe(k, aperture, wavelength, pixel_size, defocus)
    else:
        out = np.load(probe) if isinstance(probe, str | PathLike) else np.asarray(probe)
        if out.shape != (k, k) or not np.isfinite(out).all():
            raise OutcoreError(f"The probe has shape {out.shape}; the detector is {k}x{k}.",
                               f"give a finite ({k}, {k}) complex probe, or --detector "
                               f"{out.shape[-1]}.")
    if dose is not None:
        out = out * np.sqrt(dose / (np.abs(out) ** 2).sum())
    return out.astype(np.complex64)


def _truth(obj: SyntheticObject, probe: np.ndarray, top_left: np.ndarray, centres: np.ndarray,
           pixel_size: float, attrs: dict) -> xr.Dataset:
    k = probe.shape[-1]
    offsets = (np.arange(k) - k // 2) * pixel_size
    return xr.Dataset(
        {"object": (("y", "x"), obj.to_dask()),
         "probe": (("k_y", "k_x"), probe),
         "top_left": (("position", "yx"), top_left),
         "positions": (("position", "xy"), centres)},
        coords={"y": np.arange(obj.shape[0]) * pixel_size,
                "x": np.arange(obj.shape[1]) * pixel_size,
                "k_y": offsets, "k_x": offsets, "xy": ["x", "y"], "yx": ["y", "x"]},
        attrs=attrs,
    )
