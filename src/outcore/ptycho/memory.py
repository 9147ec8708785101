"""Memory model of the ptychographic reconstruction for ``outcore.plan``, per worker.

A worker holds its shard of the targets (``device``/``host`` residency: ``n / workers``
patterns of ``K x K`` float32; ``disk``: none), two copies of the state (object ``Ny x Nx``
and probe ``K x K``, complex64: the one a step reads and the one it makes), and the terms of a
step (the object gradient over the batch's region, complex128, plus probe sums). A
``ptycho-terms`` task computes ``sub_batch`` positions at a time; their scratch is about
``SCRATCH_PER_PIXEL`` bytes per detector pixel per position (windows, exit waves, far
fields, moduli, residuals and back-propagated waves in complex64/float32, several updated in
place). ``disk`` residency adds two sub-batches of frames being read.
The ``ptycho-step`` task holds the state in and out, the summed terms and three object-sized
float64/complex128 scratch arrays (illumination, full gradient, preconditioner).

``tests/test_ptycho_kernels.py`` checks the scratch against ``tracemalloc`` on real calls.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from outcore.plan import C64, C128, F32, F64, TaskMemory, zarr_read_bytes

if TYPE_CHECKING:
    from outcore.ptycho.scan import Setup
    from outcore.ptycho.simulate import Simulation

#: Scratch of ``batch_terms`` per detector pixel per position, bytes (see the module doc).
SCRATCH_PER_PIXEL = 40


def memory_model(n_positions: int, k: int, object_shape: tuple[int, int], workers: int,
                 residency: str, sub_batch: int, batch_size: int | None = None,
                 backend: str = "numpy") -> list[TaskMemory]:
    """The stages of a reconstruction of ``n_positions`` patterns of ``k x k`` on
    ``workers`` workers. Feed them to ``outcore.plan.Plan``. On the numpy backend every byte
    is host memory; on cupy the state, the terms and the scratch are device bytes, and so are
    the targets of ``device`` residency (``host`` keeps them in host memory and streams a
    sub-batch at a time, ``disk`` reads them from the store)."""
    shard = math.ceil(n_positions / max(workers, 1))
    pixels = k * k
    resident = shard * pixels * F32 if residency in ("device", "host") else 0
    object_pixels = math.prod(object_shape)
    state = object_pixels * C64 + pixels * C64
    terms = object_pixels * C128 + pixels * (C128 + F64)
    batch = min(batch_size or n_positions, n_positions)
    piece = min(sub_batch, batch, shard)
    reading = 2 * piece * pixels * F32 if residency != "device" else 0
    scratch = piece * pixels * SCRATCH_PER_PIXEL + reading + terms
    step_scratch = object_pixels * (F64 + C128 + F64)
    steps = math.ceil(n_positions / batch)
    stages = [
        TaskMemory("ptycho-shard", workers, input_bytes=0, output_bytes=resident,
                   transient_bytes=shard * pixels * F32 if residency == "device" else 0,
                   read_bytes=resident),
        TaskMemory("ptycho-terms", steps * workers, input_bytes=resident + 2 * state,
                   output_bytes=terms, transient_bytes=scratch,
                   read_bytes=piece * pixels * F32 if residency == "disk" else 0),
        TaskMemory("ptycho-step", steps, input_bytes=resident + 2 * state + terms,
                   output_bytes=state, transient_bytes=step_scratch + batch * 16),
    ]
    return stages if backend != "cupy" else [_on_device(s, resident, residency) for s in stages]


def _on_device(stage: TaskMemory, resident: int, residency: str) -> TaskMemory:
    """A stage on the GPU: its bytes are device bytes, except the targets of ``host``
    residency, which stay in host memory (with the two sub-batches being copied over)."""
    on_host = resident if residency == "host" else 0
    device = stage.peak_bytes - on_host
    host_in = on_host if stage.name != "ptycho-shard" else 0
    host_out = on_host if stage.name == "ptycho-shard" else 0
    return replace(stage, input_bytes=host_in, output_bytes=host_out, transient_bytes=0,
                   device_bytes=device)


def simulate_stages(sim: Simulation) -> list[TaskMemory]:
    """Per-task memory of a simulation: pattern chunks (object patch, waves, FFT) and the
    truth object's row bands, bytes."""
    data = sim.stack["data"].data
    k = data.shape[-1]
    frames = math.prod(max(c) for c in data.chunks[:-2]) * k * k
    out = frames * data.dtype.itemsize
    patch = _largest_patch(sim.truth["top_left"].values, data.chunks[:-2], k)
    patterns = TaskMemory("simulate-patterns", math.prod(len(c) for c in data.chunks),
                          0, out, transient_bytes=frames * (3 * C64 + 4 + F64)
                          + patch * (C64 + 4 * F64), write_bytes=out)
    obj = sim.truth["object"].data
    band = math.prod(max(c) for c in obj.chunks)
    truth = TaskMemory("truth-object", len(obj.chunks[0]), 0, band * C64,
                       transient_bytes=band * 4 * F64, write_bytes=band * C64)
    return [patterns, truth]


def _largest_patch(top_left: Any, chunks: tuple[tuple[int, ...], ...], k: int) -> int:
    """Pixels of the largest object patch one chunk of positions covers."""
    index = np.arange(len(top_left)).reshape([sum(c) for c in chunks])
    bounds = [np.cumsum((0, *c)) for c in chunks]
    largest = 0
    for block in np.ndindex(*(len(c) for c in chunks)):
        cut = tuple(slice(b[i], b[i + 1]) for b, i in zip(bounds, block, strict=True))
        corners = top_left[index[cut].ravel()]
        extent = corners.max(axis=0) - corners.min(axis=0) + k
        largest = max(largest, int(extent[0] * extent[1]))
    return largest


def preprocess_stages(ds: Any, found: Setup) -> list[TaskMemory]:
    """Per-task memory of ``preprocess``: reading the store's chunks, the mean pattern, and
    one chunk of positions turned into amplitudes (float64 roll, crop and bin), bytes."""
    data = ds["data"]
    store_chunk = math.prod(max(c) for c in data.chunks) * data.dtype.itemsize
    tasks = math.prod(len(c) for c in data.chunks)
    frame = math.prod(found.source_shape)
    n = found.chunk_positions
    positions = len(found.positions)
    chunks = math.ceil(positions / n)
    out = n * found.k**2 * 4
    return [
        TaskMemory("read-stack", tasks, store_chunk, store_chunk,
                   transient_bytes=zarr_read_bytes(store_chunk),
                   read_bytes=store_chunk),
        TaskMemory("mean-pattern", tasks, store_chunk, 2 * frame * F64,
                   transient_bytes=store_chunk // data.dtype.itemsize * F64),
        TaskMemory("amplitudes", chunks, n * frame * data.dtype.itemsize, out,
                   transient_bytes=2 * n * frame * F64 + n * found.crop**2 * F64,
                   write_bytes=out),
    ]
