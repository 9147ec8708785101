"""Test volumes as lazy dask arrays: the 3-D Shepp-Logan head phantom and a uniform ball.

Both are computed chunk by chunk from formulas, so a phantom of any size costs one chunk of
memory at a time. Coordinates follow ``outcore.tomo.geometry``: voxel centres at
``(index - (n - 1) / 2) * voxel_size``.

The Shepp-Logan phantom is a sum of ellipsoids, so its parallel-beam projections have a
closed form (:func:`shepp_logan_projections`): a beamline-sized scan (2048 columns, 1500
views) costs a formula per pixel, not a forward projection of a 2048^3 volume.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import dask.array as da
import numpy as np

from outcore.tomo.geometry import Geometry

#: The phantoms ``make_phantom`` (and ``outcore tomo simulate --phantom``) knows.
PHANTOMS: tuple[str, ...] = ("shepp-logan", "ball")

#: Ellipsoids of the 3-D Shepp-Logan head phantom (Kak and Slaney's table) with the
#: higher-contrast intensities of Toft's modified 2-D phantom: (value, semi-axes a, b, c,
#: centre x, y, z, rotation about z in degrees), lengths relative to the volume's half-extent.
SHEPP_LOGAN_3D: tuple[tuple[float, ...], ...] = (
    (1.0, 0.69, 0.92, 0.90, 0.0, 0.0, 0.0, 0.0),
    (-0.8, 0.6624, 0.874, 0.88, 0.0, 0.0, 0.0, 0.0),
    (-0.2, 0.41, 0.16, 0.21, -0.22, 0.0, -0.25, 108.0),
    (-0.2, 0.31, 0.11, 0.22, 0.22, 0.0, -0.25, 72.0),
    (0.1, 0.21, 0.25, 0.5, 0.0, 0.35, -0.25, 0.0),
    (0.1, 0.046, 0.046, 0.046, 0.0, 0.1, -0.25, 0.0),
    (0.1, 0.046, 0.023, 0.02, -0.08, -0.65, -0.25, 0.0),
    (0.1, 0.046, 0.023, 0.02, 0.06, -0.65, -0.25, 90.0),
    (0.1, 0.056, 0.04, 0.1, 0.06, -0.105, 0.625, 90.0),
    (-0.1, 0.056, 0.056, 0.1, 0.0, 0.1, 0.625, 0.0),
)


def _chunks(shape: tuple[int, ...], chunks: Any) -> Any:
    return chunks if chunks is not None else (max(1, min(shape[0], 2**24 // max(
        1, shape[1] * shape[2]))), -1, -1)


def _grid(block_info: dict, shape: tuple[int, int, int]) -> list[np.ndarray]:
    """Centre coordinates of the block's voxels, relative to each axis' half-extent."""
    location = block_info[None]["array-location"]
    axes = [(np.arange(a, b) - (n - 1) / 2) / (n / 2) for (a, b), n in zip(location, shape,
                                                                              strict=True)]
    return np.meshgrid(*axes, indexing="ij", sparse=True)


def shepp_logan(shape: Sequence[int], *, chunks: Any = None,
                dtype: Any = np.float32) -> da.Array:
    """The 3-D Shepp-Logan phantom ``(z, y, x)`` filling the volume (values 0 to 1)."""
    shape3 = tuple(int(n) for n in shape)

    def block(block_info: dict | None = None) -> np.ndarray:
        z, y, x = _grid(block_info, shape3)
        out = np.zeros(block_info[None]["chunk-shape"], np.float64)
        for value, a, b, c, x0, y0, z0, phi in SHEPP_LOGAN_3D:
            cos, sin = math.cos(math.radians(phi)), math.sin(math.radians(phi))
            xr = (x - x0) * cos + (y - y0) * sin
            yr = -(x - x0) * sin + (y - y0) * cos
            out += value * ((xr / a) ** 2 + (yr / b) ** 2 + ((z - z0) / c) ** 2 <= 1.0)
        return np.maximum(out, 0.0).astype(dtype)  # every region is >= 0; drops -1e-17

    return da.map_blocks(block, chunks=da.core.normalize_chunks(_chunks(shape3, chunks), shape3),
                         dtype=dtype, meta=np.empty((0, 0, 0), dtype))


def _ellipsoid_chords(u: np.ndarray, z: np.ndarray, theta: float, a: float, b: float,
                      c: float, x0: float, y0: float, z0: float, phi: float) -> np.ndarray:
    """Chord lengths ``(z, u)`` of the rays ``u e_u + z e_z + t e_d`` at angle ``theta``
    through the ellipsoid of semi-axes ``a, b`` (turned by ``phi`` about z) and ``c``, centred
    at ``(x0, y0, z0)``: its slice at height ``z`` is the ellipse of semi-axes ``s a, s b``,
    ``s^2 = 1 - ((z - z0) / c)^2``, whose chord at distance ``t`` from its centre's
    projection is ``2 a b sqrt(s^2 r^2 - t^2) / r^2``, ``r^2 = a^2 cos^2 + b^2 sin^2`` of
    ``theta - phi``."""
    r2 = a**2 * math.cos(theta - phi) ** 2 + b**2 * math.sin(theta - phi) ** 2
    t = u - (x0 * math.cos(theta) + y0 * math.sin(theta))
    s2 = 1.0 - ((z - z0) / c) ** 2
    inside = s2[:, None] * r2 - (t**2)[None, :]
    return 2.0 * a * b / r2 * np.sqrt(np.maximum(inside, 0.0))


def shepp_logan_projections(geometry: Geometry, shape: Sequence[int], *,
                            views_per_block: int = 8, dtype: Any = np.float32) -> da.Array:
    """The exact parallel-beam line integrals ``(view, v, u)`` of :func:`shepp_logan` of
    ``shape (z, y, x)`` (square slices, voxels of ``geometry.voxel_size``) over
    ``geometry``'s scan at each pixel centre, values times lengths (a
    ``Projector``'s projection of the voxel phantom tends to it as the voxels shrink).
    Blocks of ``views_per_block`` whole views."""
    nz, ny, nx = (int(n) for n in shape)
    if geometry.kind != "parallel":
        raise ValueError("the analytic Shepp-Logan projections are parallel-beam only")
    if ny != nx:
        raise ValueError(f"the analytic Shepp-Logan projections need square slices, not "
                         f"{ny} x {nx}")
    (nv, nu), (dv, du) = geometry.detector_shape, geometry.detector_pixel_size
    ov, ou = geometry.detector_offset
    half_xy, half_z = nx / 2 * geometry.voxel_size, nz / 2 * geometry.voxel_size
    u = (np.arange(nu) - (nu - 1) / 2) * du + ou
    z = (np.arange(nv) - (nv - 1) / 2) * dv + ov
    angles = np.asarray(geometry.angles, np.float64)

    def block(block_info: dict | None = None) -> np.ndarray:
        v0, v1 = block_info[None]["array-location"][0]
        out = np.zeros((v1 - v0, nv, nu), np.float64)
        for i, theta in enumerate(angles[v0:v1]):
            for value, a, b, c, x0, y0, z0, phi in SHEPP_LOGAN_3D:
                out[i] += value * _ellipsoid_chords(
                    u, z, float(theta), a * half_xy, b * half_xy, c * half_z, x0 * half_xy,
                    y0 * half_xy, z0 * half_z, math.radians(phi))
        return out.astype(dtype)

    chunks = da.core.normalize_chunks((views_per_block, -1, -1), (len(angles), nv, nu))
    return da.map_blocks(block, chunks=chunks, dtype=dtype, meta=np.empty((0, 0, 0), dtype))


def ball(shape: Sequence[int], radius: float, *, value: float = 1.0, voxel_size: float = 1.0,
         centre: Sequence[float] = (0.0, 0.0, 0.0), supersample: int = 4, chunks: Any = None,
         dtype: Any = np.float32) -> da.Array:
    """A uniform ball of ``radius`` (length units) around ``centre (z, y, x)``.

    Each voxel holds ``value`` times the fraction of it inside the ball, estimated on a
    ``supersample ** 3`` grid of points, so the ball's edge is smooth.
    """
    shape3 = tuple(int(n) for n in shape)
    offsets = (np.arange(supersample) + 0.5) / supersample - 0.5

    def block(block_info: dict | None = None) -> np.ndarray:
        location = block_info[None]["array-location"]
        z, y, x = (((np.arange(a, b) - (n - 1) / 2) * voxel_size - c)
                   for (a, b), n, c in zip(location, shape3, centre, strict=True))
        out = np.zeros(block_info[None]["chunk-shape"], np.float64)
        for dz in offsets:
            zz = ((z + dz * voxel_size) ** 2)[:, None, None]
            for dy in offsets:
                yy = ((y + dy * voxel_size) ** 2)[None, :, None]
                for dx in offsets:
                    xx = ((x + dx * voxel_size) ** 2)[None, None, :]
                    out += zz + yy + xx <= radius**2
        return (value * out / supersample**3).astype(dtype)

    return da.map_blocks(block, chunks=da.core.normalize_chunks(_chunks(shape3, chunks), shape3),
                         dtype=dtype, meta=np.empty((0, 0, 0), dtype))


def make_phantom(name: str, shape: tuple[int, int, int], voxel_size: float, slab: int
                 ) -> da.Array:
    """The phantom ``name`` (one of ``PHANTOMS``) as a lazy dask array in blocks of ``slab``
    planes (values 0 to 1 per m; the ball's radius is 0.4 of the smallest edge)."""
    chunks = (slab, -1, -1)
    if name == "ball":
        radius = 0.4 * min(shape) * voxel_size
        return ball(shape, radius, voxel_size=voxel_size, chunks=chunks)
    return shepp_logan(shape, chunks=chunks)
