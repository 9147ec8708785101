"""Streaming statistics of a frame stack: mean and maximum frame, total of each frame.

The first operator every stack meets (and the demo's): one read pass over the store, chunk by
chunk, with partial sums combined in a tree. Works on any layout whose last two dims are the
frame (diffraction ``k_y, k_x``; projections ``v, u``; cutouts ``y, x``).
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from outcore.plan import TaskMemory

#: Bytes a zarr read holds per byte of chunk at its peak: the encoded bytes read from the
#: store, the decoded buffer and the array it is copied into (measured 2.9-3.0 with
#: tracemalloc for incompressible float32; tests/test_plan.py checks it).
ZARR_READ_FACTOR = 3.0


def frame_dims(da: xr.DataArray) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Split a stack's dims into (frame index dims, the two frame pixel dims)."""
    if da.ndim < 3:
        raise ValueError(f"a stack needs at least 3 dims, got {da.dims}")
    return tuple(da.dims[:-2]), tuple(da.dims[-2:])


def stack_statistics(data: xr.DataArray) -> xr.Dataset:
    """Lazy statistics of a stack ``data(*index, py, px)``.

    Returns ``mean(py, px)`` and ``maximum(py, px)`` over all frames (float64 sums) and
    ``total(*index)``, the sum of each frame. Nothing is computed until asked. NaN
    propagates (no NaN-skipping pass: the layouts that stream here refuse NaN on save).
    """
    index, pixels = frame_dims(data)
    return xr.Dataset(
        {
            "mean": data.mean(dim=index, dtype=np.float64, skipna=False),
            "maximum": data.max(dim=index, skipna=False),
            "total": data.sum(dim=pixels, dtype=np.float64, skipna=False),
        },
        attrs={"source_dims": list(data.dims)},
    )


def memory_model(data: xr.DataArray) -> list[TaskMemory]:
    """Per-task memory of ``stack_statistics`` on the chunks of ``data`` (bytes)."""
    chunks = data.chunks or tuple((n,) for n in data.shape)
    chunk_items = int(np.prod([max(c) for c in chunks]))
    chunk_bytes = chunk_items * data.dtype.itemsize
    frame_items = int(np.prod(data.shape[-2:]))
    frames_per_chunk = chunk_items // frame_items
    tasks = int(np.prod([len(c) for c in chunks]))
    partials = 2 * frame_items * 8 + frames_per_chunk * 8
    return [
        TaskMemory(
            name="read-and-reduce",
            tasks=tasks,
            input_bytes=chunk_bytes,
            output_bytes=partials,
            transient_bytes=int((ZARR_READ_FACTOR - 1) * chunk_bytes),
            read_bytes=chunk_bytes,
        ),
        TaskMemory(
            name="combine",
            tasks=max(tasks - 1, 1),
            input_bytes=4 * partials,
            output_bytes=partials,
        ),
    ]
