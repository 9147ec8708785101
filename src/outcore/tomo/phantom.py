"""Test volumes as lazy dask arrays: the 3-D Shepp-Logan head phantom and a uniform ball.

Both are computed chunk by chunk from formulas, so a phantom of any size costs one chunk of
memory at a time. Coordinates follow ``outcore.tomo.geometry``: voxel centres at
``(index - (n - 1) / 2) * voxel_size``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import dask.array as da
import numpy as np

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
