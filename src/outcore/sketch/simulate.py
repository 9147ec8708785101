"""A simulated 4D-STEM stack of a few crystalline phases, with its truth.

The scan is cut into grains (the Voronoi cells of ``2 * phases`` random centres), grain
``g`` of phase ``g % phases``. A phase's pattern is the central disk, a diffuse halo and the
Bragg spots of its own lattice (spacing, angle and skew drawn from the seed), normalised to
unit sum. The specimen thickens linearly across the scan and scales each pattern. Without
noise the stack is exactly of rank ``phases``; ``dose`` (electrons per pattern at unit
thickness) draws Poisson counts. The stack is lazy and made block by block, its noise drawn
per scan row from the seed, so any chunking gives the same values.
"""

from __future__ import annotations

import dask.array as da
import numpy as np
import xarray as xr

from outcore.arguments import keywords_checked
from outcore.checks import at_least, positive, shape

__all__ = ["simulate_phases"]

#: The attributes of the simulated stack that the diffraction layout needs: 300 keV
#: electrons, a 1 nm scan step, a reciprocal pixel of 0.05 / nm.
ATTRS = {"wavelength": 1.97e-12, "scan_step": 1e-9, "reciprocal_pixel_size": 5e7}
#: Expected electrons per pattern at unit thickness when no ``dose`` is given.
SCALE = 1e4


def phase_patterns(phases: int, detector: int, seed: int = 0) -> np.ndarray:
    """The ``(phases, detector, detector)`` float64 patterns of the phases, unit sum each."""
    rng = np.random.default_rng([seed, 1])
    k = np.arange(detector) - (detector - 1) / 2
    ky, kx = np.meshgrid(k, k, indexing="ij")
    radius = np.hypot(ky, kx)
    disk = 1 / (1 + np.exp((radius - detector / 14) / 0.7))
    halo = 0.02 * np.exp(-radius / (detector / 6))
    out = np.empty((phases, detector, detector))
    for p in range(phases):
        spacing = detector * rng.uniform(0.09, 0.16)
        angle, skew = rng.uniform(0, np.pi), rng.uniform(np.pi / 3, np.pi / 2)
        a1 = spacing * np.array([np.cos(angle), np.sin(angle)])
        a2 = spacing * np.array([np.cos(angle + skew), np.sin(angle + skew)])
        pattern = disk + halo
        for i in range(-8, 9):
            for j in range(-8, 9):
                gy, gx = i * a1 + j * a2
                g = np.hypot(gy, gx)
                if 0 < g < detector / 2 - 2:
                    strength = 0.4 * np.exp(-(g / (detector / 4)) ** 2)
                    pattern = pattern + strength * np.exp(-((ky - gy) ** 2 + (kx - gx) ** 2)
                                                          / 2.0)
        out[p] = pattern / pattern.sum()
    return out


def phase_map(scan: tuple[int, int], phases: int, seed: int = 0) -> np.ndarray:
    """The ``scan`` map of phase indices (int64): grain ``g`` of ``2 * phases`` is of phase
    ``g % phases``."""
    rng = np.random.default_rng([seed, 2])
    centres = rng.uniform(0, 1, (2 * phases, 2)) * np.array(scan)
    y, x = np.meshgrid(np.arange(scan[0]), np.arange(scan[1]), indexing="ij")
    distance = (y[..., None] - centres[:, 0]) ** 2 + (x[..., None] - centres[:, 1]) ** 2
    return (np.argmin(distance, axis=-1) % phases).astype(np.int64)


def thickness_map(scan: tuple[int, int]) -> np.ndarray:
    """Relative thickness, from 0.6 at the first scan position to 1.4 at the last."""
    y, x = np.meshgrid(np.linspace(0, 1, scan[0]), np.linspace(0, 1, scan[1]), indexing="ij")
    return 0.6 + 0.4 * (y + x)


def _rows(start: int, stop: int, patterns: np.ndarray, phase: np.ndarray,
          thickness: np.ndarray, scale: float, poisson: bool, seed: int,
          dtype: np.dtype) -> np.ndarray:
    """Scan rows ``start:stop`` of the stack, ``(rows, scan_x, k, k)`` of ``dtype``."""
    clean = scale * thickness[start:stop, :, None, None] * patterns[phase[start:stop]]
    if not poisson:
        return clean.astype(dtype)
    out = np.empty(clean.shape, dtype=dtype)
    for row in range(start, stop):
        out[row - start] = np.random.default_rng([seed, 3, row]).poisson(clean[row - start])
    return out


@keywords_checked
def simulate_phases(scan: tuple[int, int] = (32, 32), detector: int = 64, phases: int = 3, *,
                    dose: float | None = None, seed: int = 0, chunk_rows: int | None = None,
                    dtype: str = "float32") -> tuple[xr.Dataset, xr.Dataset]:
    """A lazy ``diffraction`` stack ``data(scan_y, scan_x, k_y, k_x)`` of ``phases`` phases
    and its truth (``phase(scan_y, scan_x)``, ``thickness(scan_y, scan_x)``,
    ``patterns(phase, k_y, k_x)``). Values are expected electrons (``dose`` per pattern at
    unit thickness, ``SCALE`` without it); with ``dose`` they are Poisson counts. Blocks of
    ``chunk_rows`` scan rows (default: about 32 MiB)."""
    scan = shape(scan, "scan", 2)
    at_least(detector, "detector", 8)
    at_least(phases, "phases")
    at_least(seed, "seed", 0)
    at_least(chunk_rows, "chunk_rows")
    positive(dose, "dose", "dose=1e4 (electrons per pattern)")
    patterns = phase_patterns(phases, detector, seed)
    phase = phase_map(scan, phases, seed)
    thickness = thickness_map(scan)
    out_dtype = np.dtype(dtype)
    rows = chunk_rows or max(1, (32 * 2**20) // (scan[1] * detector**2 * out_dtype.itemsize))
    scale = SCALE if dose is None else float(dose)

    def block(block_info: dict | None = None) -> np.ndarray:
        start, stop = block_info[None]["array-location"][0]
        return _rows(start, stop, patterns, phase, thickness, scale, dose is not None, seed,
                     out_dtype)

    chunks = (tuple(min(rows, scan[0] - i) for i in range(0, scan[0], rows)), (scan[1],),
              (detector,), (detector,))
    data = da.map_blocks(block, chunks=chunks, dtype=out_dtype)
    dims = ("scan_y", "scan_x", "k_y", "k_x")
    stack = xr.Dataset({"data": (dims, data)}, attrs=dict(ATTRS))
    truth = xr.Dataset({"phase": (dims[:2], phase), "thickness": (dims[:2], thickness),
                        "patterns": (("phase", "k_y", "k_x"), patterns)})
    return stack, truth
