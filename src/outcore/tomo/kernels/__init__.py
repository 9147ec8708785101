"""Kernels on one block, for numpy (numba, scipy) or cupy arrays: the projector's and the
ramp filter's.

``forward`` (Joseph's ray-driven projector), ``adjoint`` (its exact transpose) and
``backproject`` (voxel-driven, weighted, for FBP/FDK) work on one block of views and one
z-slab; ``filter_rows`` convolves the rows of a block of projections with the ramp filter;
``gridrec`` reconstructs a slab's planes from their sinograms in Fourier space.
Each dispatches on the array it gets (``outcore.backend.kernels``): numpy runs
``kernels.cpu``, cupy runs ``kernels.gpu``. A slab is the planes ``z0 <= k < z0 + nz``
of a volume of ``depth`` planes; a projection block holds the detector rows
``v0 <= v < v0 + rows`` of some views. Voxels outside the slab and rows outside the block count
as zero, so sums over slabs (forward) and over row blocks (adjoint) are exact.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from outcore.backend import array_namespace, kernels
from outcore.tomo.geometry import Geometry

Array = Any


def _centre(depth: int, z0: int) -> float:
    """Centre index of the volume in the slab's own indices."""
    return (depth - 1) / 2.0 - z0


def forward(slab: Array, angles: np.ndarray, geometry: Geometry, *, z0: int = 0,
            depth: int | None = None, rows: tuple[int, int] | None = None) -> Array:
    """Project ``slab (nz, ny, nx)``: ``(views, v1 - v0, nu)`` for the detector rows ``rows``.

    ``angles`` (views,) in radians; ``depth`` is the whole volume's nz (the slab's own by
    default); ``rows`` defaults to every row. Same dtype and backend as ``slab``; sums in
    the slab's dtype on the host, in float64 on a GPU.
    """
    depth = slab.shape[0] if depth is None else depth
    nv, nu = geometry.detector_shape
    v0, v1 = rows if rows is not None else (0, nv)
    return kernels(slab, __name__).forward(slab, np.asarray(angles, np.float64),
                                           geometry.kernel_args(), v0, v1 - v0, nu, nv,
                                           _centre(depth, z0))


def adjoint(proj: Array, angles: np.ndarray, geometry: Geometry, slab_shape: tuple[int, ...],
            *, z0: int = 0, depth: int | None = None, v0: int = 0, out: Array | None = None
            ) -> Array:
    """Exact transpose of ``forward``: ``proj (views, rows, nu)`` (rows from ``v0``) to a slab.

    With ``out`` (a float64 slab), adds into it and returns it; else returns a new slab of
    ``proj``'s dtype (accumulated in float64; on the host each call first sums in ``proj``'s
    dtype).
    """
    return _accumulate(proj, slab_shape, z0, depth, out,
                       lambda acc, cz: kernels(proj, __name__).adjoint(
                           proj, acc, np.asarray(angles, np.float64), geometry.kernel_args(),
                           v0, geometry.detector_shape[0], cz))


def backproject(proj: Array, angles: np.ndarray, geometry: Geometry,
                slab_shape: tuple[int, ...], weights: np.ndarray, *, z0: int = 0,
                depth: int | None = None, v0: int = 0, out: Array | None = None) -> Array:
    """Voxel-driven weighted backprojection (FBP/FDK) of ``proj (views, rows, nu)`` to a slab.

    Every voxel adds ``weights[view]`` times the projection interpolated bilinearly at its
    centre's image (times FDK's ``(source_distance / depth)^2`` for the cone beam). ``out``
    as in ``adjoint``.
    """
    return _accumulate(proj, slab_shape, z0, depth, out,
                       lambda acc, cz: kernels(proj, __name__).backproject(
                           proj, acc, np.asarray(angles, np.float64),
                           np.asarray(weights, np.float64), geometry.kernel_args(), v0,
                           geometry.detector_shape[0], cz))


def filter_rows(rows: Array, response: np.ndarray, size: int) -> Array:
    """Each row of ``rows (..., nu)`` convolved with a filter given by its frequency
    ``response`` (``size // 2 + 1`` values: the ``rfft`` grid of ``size >= 2 nu`` points, so
    zero padding and no wrap-around), in ``rows``' dtype and on its backend (numpy: scipy's
    FFT, cupy: cupyx's; float32 in, float32 out)."""
    return kernels(rows, __name__).filter_rows(rows, response, size)


def gridrec(sinograms: Array, pairs: np.ndarray, weights: np.ndarray, factors: np.ndarray,
            coords: np.ndarray, shape: tuple[int, int], epsilon: float) -> Array:
    """Gridrec of a slab's planes from their band of sinograms ``(views, rows, nu)`` on its
    backend: plane ``p`` is ``weights[p, 0] * sinograms[:, pairs[p, 0]] + weights[p, 1] *
    sinograms[:, pairs[p, 1]]``, its ``rfft`` (on ``2 * (K - 1)`` points) times ``factors
    (views, K)`` at the polar frequencies ``coords (views, K, 2)`` (``xi_y, xi_x``, radians
    per voxel) gridded onto ``shape (ny, nx)`` by a type-1 NUFFT of relative accuracy
    ``epsilon``, real part (``outcore.tomo.reconstruction.gridrec``). Returns ``(planes,
    ny, nx)`` in the sinograms' dtype (numpy: ducc0; cupy: a gridding kernel of our own)."""
    return kernels(sinograms, __name__).gridrec(sinograms, np.asarray(pairs),
                                                np.asarray(weights), factors, coords,
                                                tuple(shape), epsilon)


_WARM: set[tuple[str, str]] = set()


def warm(kind: str = "parallel", dtype: Any = np.float32) -> None:
    """Compile the CPU kernels of one geometry (``parallel`` or ``cone``) for blocks of
    ``dtype`` in this process, or load them from numba's on-disk cache (``cache=True``),
    once per process and pair.

    ``Projector`` calls it for its own geometry and dtype where it builds a graph, so that
    the kernels are compiled once per machine, here, rather than in every worker: a worker
    that compiles them peaks about 60-85 MiB higher (345-372 MiB instead of 285-297, VmHWM)
    and keeps that memory (``memory.TOMO_WORKER_BASELINE_BYTES``). Workers that share numba's
    cache directory (the package's ``__pycache__``, or ``NUMBA_CACHE_DIR``) then only load
    the machine code. The arguments match the ``Projector``'s calls (C-contiguous blocks,
    read-only angles), so that every signature a task uses is in the cache. Only the pair
    asked for: each of the other three costs a compile on a fresh install and a cache load
    in every process.
    """
    key = (kind, np.dtype(dtype).name)
    if key in _WARM:
        return
    angles = np.array([0.0, 1.0])  # read-only in each geometry
    geometry = (Geometry.parallel(angles, (3, 5)) if kind == "parallel"
                else Geometry.cone(angles, (3, 5), 20.0, 10.0))
    slab = np.ones((2, 3, 4), dtype)
    proj = forward(slab, geometry.angles, geometry, z0=0, depth=3, rows=(0, 3))
    adjoint(proj, geometry.angles, geometry, slab.shape, z0=0, depth=3)
    backproject(proj, geometry.angles, geometry, slab.shape, np.ones(2), z0=0, depth=3)
    _WARM.add(key)


def _accumulate(proj: Array, slab_shape: tuple[int, ...], z0: int, depth: int | None,
                out: Array | None, run: Any) -> Array:
    depth = slab_shape[0] if depth is None else depth
    acc = out if out is not None else array_namespace(proj).zeros(slab_shape, np.float64)
    if acc.dtype != np.float64 or tuple(acc.shape) != tuple(slab_shape):
        raise ValueError(f"out must be a float64 array of shape {tuple(slab_shape)}.")
    run(acc, _centre(depth, z0))
    return acc if out is not None else acc.astype(proj.dtype)


__all__ = ["adjoint", "backproject", "filter_rows", "forward", "gridrec", "warm"]
