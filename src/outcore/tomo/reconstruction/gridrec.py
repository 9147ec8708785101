"""Gridrec: parallel-beam reconstruction in Fourier space, one z-slice at a time.

FBP evaluates ``f(x) = sum_views (pi / n) q(theta, x . e_u)``, ``q`` the ramp-filtered
projection, by interpolating ``q`` at every voxel for every view (``N^2`` times the views a
slice). Gridrec evaluates the same sum in Fourier space. Write ``q`` of a view (detector
index ``j = (u - offset_u) / du + (nu - 1) / 2``) as the trigonometric series of its
spectrum on the ramp filter's padded grid of ``size = memory.padded(nu)`` points,
``q(j) = (1 / size) sum_k Q_k exp(2 pi i k j / size)``, with ``Q_k`` the row's ``rfft``
times the windowed ramp (``solvers.ramp_filter``: the same response and windows as FBP).
A voxel at ``(x, y) = ((i - cx) voxel, (j - cy) voxel)`` then sees

    f[j, i] = Re sum_{view, k} c_{view, k} exp(i (xi_y (j - ny // 2) + xi_x (i - nx // 2))),

polar frequencies ``(xi_x, xi_y) = rho_k (cos theta, sin theta)`` with ``rho_k = 2 pi k
voxel / (size du)`` and ``c = (pi / n) w_k Q_k / size`` times the phase of the detector
centre and offset (``2 pi k ((nu - 1) / 2 - offset_u / du) / size``) and of the half voxel
between ``(n - 1) / 2`` and ``n // 2`` (even widths); ``w_k`` counts the negative
frequencies (2, and 1 at 0 and at the Nyquist frequency), so the half spectrum suffices and
the image is the real part. That sum is a type-1 (non-uniform to uniform) NUFFT of the
polar samples onto the image grid: ``ducc0.nufft`` on the host (``kernels.cpu.gridrec``,
accuracy ``EPSILON``), an exponential-of-semicircle gridding of our own on a GPU
(``kernels.gpu.gridrec``). Its cost per slice grows as ``N^2 log N`` plus the samples
(views times ``size / 2``), not ``N^2`` times the views. The frequencies are folded into
``[-pi, pi)`` (the sum is ``2 pi``-periodic in them, the half-voxel phase taken before), so
any voxel size works.

Where FBP interpolates ``q`` linearly between detector pixels, gridrec interpolates it
exactly (band-limited), so its images are a little sharper: on Shepp-Logan its PSNR is FBP's
or better (``tests/test_tomo_gridrec.py``). Values are in FBP's units (attenuation per unit
length): the same ramp (times ``du``), the same ``pi / n`` per view.

Out of core: the volume is cut into z-slabs of ``slab`` planes (a ``memory.Cut`` of every
view, partition ``space``; ``planning.fitting_slabs`` chooses them,
``memory.gridrec_stages`` counts them); the projections are re-sliced into sinogram chunks
(every view, a few detector rows, ``outcore.tomo.corrections.reslice``) cut at the images
of the slab boundaries, and each slab's task reads the chunks that meet its band of rows
(``Geometry.row_band``) and returns its planes. A plane interpolates its two detector rows
as FBP's backprojector does. A plane's value depends on its own sinogram only, so the
volume is the same bit for bit whatever the slabs and the workers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import dask.array as da
import numpy as np
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph

from outcore import backend as backends
from outcore.errors import OutcoreError
from outcore.plan import TaskMemory
from outcore.tomo import kernels
from outcore.tomo.corrections import reslice
from outcore.tomo.geometry import Geometry
from outcore.tomo.memory import (
    POLAR_BLOCK_VIEWS,
    Chunks,
    Cut,
    CutRunner,
    Range,
    gridrec_stages,
    padded,
    sinogram_chunks,
)
from outcore.tomo.reconstruction.planning import fitting_slabs, running_resources
from outcore.tomo.reconstruction.projector import as_dask
from outcore.tomo.reconstruction.solvers import _view_weights, ramp_filter

__all__ = ["EPSILON", "Gridrec", "check_parallel", "gridrec", "polar_samples", "slice_rows"]

#: Relative accuracy asked of the NUFFT: ducc0 reaches about a sixth of it in the image's
#: L2 norm (1.6e-6 against a float64 NUFFT at 1e-10, a 1024^2 slice from 1500 views), at
#: the float32 rounding of FBP's own filter (``tests/test_tomo_filter.py``: 2e-6 of the
#: peak); 1.1e-6, ducc0's least for float32, cost 10-20 % more time at 2048^2.
EPSILON = 1e-5


def check_parallel(geometry: Geometry, fix: str = 'use method="fbp", which runs FDK for a '
                   "cone-beam scan.") -> None:
    """Refuse a cone-beam scan: gridrec's Fourier slices hold for parallel rays only."""
    if geometry.kind != "parallel":
        raise OutcoreError("gridrec reconstructs parallel-beam scans; this one is "
                           f"{geometry.kind}-beam (FDK reconstructs those).", fix)


def polar_samples(geometry: Geometry, shape: tuple[int, int], window: str,
                  dtype: Any = np.float32) -> tuple[np.ndarray, np.ndarray]:
    """The polar grid of a slice ``shape (ny, nx)``: ``factors (views, size // 2 + 1)``
    (complex, the ramp with its window, ``w_k``, ``pi / n`` and the phases of the module
    doc, divided by ``size``) and ``coords (views, size // 2 + 1, 2)`` (``xi_y, xi_x`` in
    radians per voxel, folded into ``[-pi, pi)``), ``size = padded(nu)``; built in float64
    a block of ``POLAR_BLOCK_VIEWS`` views at a time."""
    real = np.dtype(dtype)
    nu = geometry.detector_shape[1]
    du, ou = geometry.detector_pixel_size[1], geometry.detector_offset[1]
    size = padded(nu)
    k = np.arange(size // 2 + 1)
    counted = np.where((k == 0) | (k == size // 2), 1.0, 2.0)  # the negative frequencies
    radial = ramp_filter(nu, du, window) * counted / size
    rho = 2 * math.pi * geometry.voxel_size / (size * du) * k
    detector = 2 * math.pi / size * ((nu - 1) / 2 - ou / du) * k
    ny, nx = shape
    half_y, half_x = ny // 2 - (ny - 1) / 2, nx // 2 - (nx - 1) / 2  # 0.5 for even widths
    views = _view_weights(geometry.n_views)
    factors = np.empty((geometry.n_views, k.size), np.result_type(real, np.complex64))
    coords = np.empty((geometry.n_views, k.size, 2), real)
    for a0 in range(0, geometry.n_views, POLAR_BLOCK_VIEWS):
        angles = geometry.angles[a0:a0 + POLAR_BLOCK_VIEWS, None]
        xi_x, xi_y = rho * np.cos(angles), rho * np.sin(angles)
        phase = detector + xi_x * half_x + xi_y * half_y
        weight = views[a0:a0 + POLAR_BLOCK_VIEWS, None] * radial
        factors[a0:a0 + len(angles)].real = weight * np.cos(phase)
        factors[a0:a0 + len(angles)].imag = weight * np.sin(phase)
        coords[a0:a0 + len(angles), :, 0] = np.remainder(xi_y + math.pi, 2 * math.pi) - math.pi
        coords[a0:a0 + len(angles), :, 1] = np.remainder(xi_x + math.pi, 2 * math.pi) - math.pi
    return factors, coords


def slice_rows(geometry: Geometry, depth: int, z0: int, z1: int, band: Range
               ) -> tuple[np.ndarray, np.ndarray]:
    """For the planes ``z0 <= k < z1`` of a volume of ``depth`` planes: the two detector
    rows (indices into the band of rows ``band``) each plane interpolates, ``(planes, 2)``,
    and their weights ``(planes, 2)``, as FBP's backprojector takes them (a row outside the
    band weighs 0)."""
    dv, ov = geometry.detector_pixel_size[0], geometry.detector_offset[0]
    n_rows = band[1] - band[0]
    cv = (geometry.detector_shape[0] - 1) / 2 - band[0]
    k = np.arange(z0, z1, dtype=np.float64)
    fv = np.clip(((k - (depth - 1) / 2) * geometry.voxel_size - ov) / dv + cv, -2.0,
                 n_rows + 1.0)
    iv = np.floor(fv).astype(np.int64)
    wv = fv - iv
    weights = np.stack([(1 - wv) * ((iv >= 0) & (iv < n_rows)),
                        wv * ((iv >= -1) & (iv < n_rows - 1))], axis=1)
    rows = np.clip(np.stack([iv, iv + 1], axis=1), 0, n_rows - 1)
    return rows, weights


class Gridrec(CutRunner):
    """Gridrec of a parallel-beam ``geometry`` into a volume ``volume_shape (z, y, x)``, in
    z-slabs of ``slab`` planes (None: ``planning.fitting_slabs`` chooses them for the
    running cluster, this process's default client, or for ``memory_limit`` per worker and
    ``workers`` when given; without either, ``planning.DEFAULT_LIMIT`` on one worker), on
    ``backend`` (numpy, cupy, auto) in ``dtype``."""

    def __init__(self, geometry: Geometry, volume_shape: Sequence[int], slab: int | None = None,
                 *, memory_limit: int | str | None = None, workers: int | None = None,
                 backend: str = "numpy", dtype: Any = np.float32) -> None:
        check_parallel(geometry)
        resolved = backends.resolve(backend)
        cut = Cut(geometry, volume_shape, "space", geometry.n_views, slab or 1, dtype,
                  backend=resolved)  # checks the shape
        if slab is None:
            running = running_resources(resolved)
            resources = replace(running, workers=workers or running.workers,
                                memory_limit=_limit(memory_limit) or running.memory_limit)
            cut = fitting_slabs(geometry, cut.volume_shape, None, gridrec_stages, resources,
                                dtype=dtype)
        self.cut = cut

    @classmethod
    def of(cls, cut: Cut) -> Gridrec:
        """The gridrec that runs ``cut`` (the slabs a plan chose)."""
        return cls(cut.geometry, cut.volume_shape, cut.slab, backend=cut.backend,
                   dtype=cut.dtype)

    @property
    def sinogram_chunks(self) -> Chunks:
        """The re-sliced projections' chunks: every view, the row chunks, every column."""
        return sinogram_chunks(self.cut)

    def reconstruct(self, projections: Any, window: str = "ram-lak") -> da.Array:
        """The lazy volume ``(z, y, x)`` (attenuation per unit length) of ``projections
        (view, v, u)`` (dask, numpy or xarray), in slabs."""
        ramp_filter(1, 1.0, window)  # a window it does not know fails here, not in a task
        g = self.geometry
        if tuple(projections.shape) != g.projection_shape:
            raise ValueError(f"projections has shape {tuple(projections.shape)}; this "
                             f"geometry expects {g.projection_shape}.")
        data = as_dask(projections).astype(self.dtype)
        sinograms = reslice.rechunk(data, self.sinogram_chunks)
        token = tokenize(self, sinograms.name, window)
        name = f"tomo-gridrec-{token}"
        depth = self.volume_shape[0]
        cut = self.blocks
        graph: dict = {}
        for s, (z0, z1) in enumerate(cut.slabs):
            pieces = cut.pieces(s)
            graph[(name, s, 0, 0)] = (
                _slab_task, [(sinograms.name, 0, r, 0) for r in pieces],
                [cut.row_chunks[r] for r in pieces], cut.bands[s],
                *slice_rows(g, depth, z0, z1, cut.bands[s]), g, self.volume_shape[1:],
                window, self.backend)
        layer = HighLevelGraph.from_collections(name, graph, dependencies=[sinograms])
        return da.Array(layer, name, self.volume_chunks, dtype=self.dtype,
                        meta=np.empty((0, 0, 0), self.dtype))

    def memory(self, input_chunks: Chunks | None = None) -> list[TaskMemory]:
        """The stages of ``reconstruct`` (bytes per task, ``memory.gridrec_stages``):
        reading the projections stored in ``input_chunks`` (None: nothing read), their
        re-slice and the slabs."""
        return gridrec_stages(self.cut, input_chunks)

    def __dask_tokenize__(self) -> tuple:
        g = self.geometry
        return ("outcore.tomo.Gridrec", g.angles.tobytes(), g.detector_shape,
                tuple(sorted(g.to_attrs().items(), key=str)), self.volume_shape, self.slab,
                self.backend, self.dtype.str, EPSILON)

    def __repr__(self) -> str:
        return (f"Gridrec(volume {self.volume_shape}, {self.geometry.n_views} views, "
                f"slab={self.slab})")


def _limit(memory_limit: int | str | None) -> int | None:
    from dask.utils import parse_bytes

    if memory_limit is None:
        return None
    return int(parse_bytes(memory_limit)) if isinstance(memory_limit, str) else int(memory_limit)


def _slab_task(pieces: list[np.ndarray], rows: list[Range], band: Range, pairs: np.ndarray,
               weights: np.ndarray, geometry: Geometry, shape: tuple[int, int], window: str,
               backend: str) -> np.ndarray:
    """One slab: its band of rows cut from the sinogram chunks ``pieces`` (rows ``rows``),
    then each plane's sinogram gridded (``kernels.gridrec``); a host array."""
    first = pieces[0]
    sinograms = np.empty((first.shape[0], band[1] - band[0], first.shape[2]), first.dtype)
    for (r0, r1), piece in zip(rows, pieces, strict=True):
        lo, hi = max(r0, band[0]), min(r1, band[1])
        sinograms[:, lo - band[0]:hi - band[0]] = piece[:, lo - r0:hi - r0]
    factors, coords = polar_samples(geometry, shape, window, first.dtype)
    slab = kernels.gridrec(backends.to_backend(sinograms, backend), pairs, weights, factors,
                           coords, shape, EPSILON)
    return backends.to_host(slab)


def gridrec(projections: Any, geometry: Geometry, volume_shape: Sequence[int],
            window: str = "ram-lak", *, slab: int | None = None,
            memory_limit: int | str | None = None, workers: int | None = None,
            backend: str = "numpy", dtype: Any = np.float32) -> da.Array:
    """Gridrec of parallel-beam ``projections (view, v, u)`` (dask, numpy or xarray): the
    lazy volume ``volume_shape (z, y, x)`` in attenuation per unit length, FBP's values
    within its interpolation (see the module doc). ``window`` as FBP's; ``slab`` planes per
    task (None: chosen for the running cluster, or ``memory_limit`` and ``workers``). A
    cone-beam geometry is refused (``method="fbp"`` runs FDK for it). The building block
    of ``outcore.tomo.gridrec``, which takes a scan as xarray."""
    return Gridrec(geometry, volume_shape, slab, memory_limit=memory_limit, workers=workers,
                   backend=backend, dtype=dtype).reconstruct(projections, window)
