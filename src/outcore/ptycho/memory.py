"""Memory model of the ptychographic reconstruction for ``outcore.plan``, per worker.

A worker holds one shard actor (``engine.ShardActor``) for the whole run: its targets
(``device``/``host`` residency: ``n / workers`` patterns of ``K x K`` float32; ``disk``:
none, two sub-batches being read instead), its copy of the state (the ``S`` object slices
``Ny x Nx`` and the ``M`` probe modes ``K x K``, complex64, the positions and where they
started, float64) and, during a step, the summed terms it received (the object gradient,
complex128, on the batch's region, at most the object, with several slices also each slice's
illumination, float64, plus the probe sums and, with refinement, three small arrays per
position). One call of the actor (``ptycho-step``) first
applies the update (a new state beside the old, the full gradient, the step, the
illumination and the preconditioner, on the terms' region) and then computes its terms
``sub_batch`` positions at a time: the scratch of ``kernels.batch_terms`` per detector pixel
per position (``scratch_per_pixel``: windows, shifted probes, exit waves, far fields,
residuals and back-propagated waves per mode and slice, and the Jacobians of refinement), and
one sub-batch's terms beside those they are added into.

On the numpy backend every byte is host memory. On cupy the state, the terms, the update and
the scratch are device bytes, and so are the targets of ``device`` residency; the host keeps
the targets of ``host`` residency (page-locked), the sub-batches being read (``host`` and
``disk``) and the host copies of the terms received and sent.

``tests/test_ptycho_kernels.py`` checks the scratch against ``tracemalloc`` on real calls.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from outcore.plan import C64, C128, F32, F64, TaskMemory, zarr_read_bytes

if TYPE_CHECKING:
    from outcore.ptycho.preprocessing.scan import Setup
    from outcore.ptycho.simulation import Simulation


#: Resident memory of a worker process that has run reconstruction steps, bytes: 356-359 MiB
#: measured (VmHWM, ``peak_worker_rss``, a small scan, refined or not) against 203 MiB before
#: the host loops were compiled: ``import numba`` (llvmlite's LLVM) and loading the loops from
#: numba's cache add about 155 MiB. ``ptycho reconstruct``'s plans count it in place of
#: ``outcore.plan.WORKER_BASELINE_BYTES``.
PTYCHO_WORKER_BASELINE_BYTES = 360 * 2**20


def scratch_per_pixel(modes: int = 1, slices: int = 1, subpixel: bool = False,
                      refine: bool = False, nearfield: bool = False) -> int:
    """Bytes of ``batch_terms`` scratch per detector pixel per position (measured with
    tracemalloc on 64 x 64 patterns: 9.5 for one mode and slice on whole pixels, 28 with
    three modes, 26 with sub-pixel positions; each further slice about 5 + 12 M, the shift
    8 + 9 M, refinement 22 M more; the near field's transfer to the detector one wave, 8 M,
    more)."""
    shift = int(subpixel or refine)
    further = slices - 1
    return (1 + 10 * modes + further * (5 + 12 * modes) + shift * (8 + 9 * modes)
            + 22 * modes * int(refine) + 8 * modes * int(nearfield))


def intensities_per_pixel(modes: int = 1, slices: int = 1, subpixel: bool = False) -> int:
    """Bytes of ``kernels.intensities`` scratch per detector pixel per position (the waves,
    their centred copy and the intensities; measured with tracemalloc: 16 for one mode and
    slice, 16 per mode, 8 more with sub-pixel positions, about 12 M per further slice)."""
    return 4 + 8 * int(subpixel) + 16 * modes + 12 * modes * (slices - 1)


#: Scratch of the simplest case (one mode and slice, whole pixels), bytes per pixel.
SCRATCH_PER_PIXEL = scratch_per_pixel()


def memory_model(n_positions: int, k: int, object_shape: tuple[int, int], workers: int,
                 residency: str, sub_batch: int, batch_size: int | None = None,
                 backend: str = "numpy", modes: int = 1, slices: int = 1,
                 subpixel: bool = False, refine: bool = False, nearfield: bool = False
                 ) -> list[TaskMemory]:
    """The stages of a reconstruction of ``n_positions`` patterns of ``k x k`` on
    ``workers`` workers with ``modes`` probe modes and ``slices`` object slices
    (``subpixel``: positions off the pixel grid; ``refine``: position refinement;
    ``nearfield``: a near-field scan). Feed them
    to ``outcore.plan.Plan``. See the module doc for what is host and what device memory."""
    shard = math.ceil(n_positions / max(workers, 1))
    pixels = k * k
    targets = shard * pixels * F32 if residency in ("device", "host") else 0
    object_pixels = math.prod(object_shape)
    batch = min(batch_size or n_positions, n_positions)
    piece = min(sub_batch, batch, shard)
    state = (slices * object_pixels + modes * pixels) * C64 + 2 * n_positions * 2 * F64
    terms = slices * object_pixels * (C128 + (F64 if slices > 1 else 0)) \
        + pixels * (modes * C128 + F64) + (6 * F64 * batch if refine else 0)
    update = slices * object_pixels * (C128 + C64 + F64) + object_pixels * F64 \
        + modes * pixels * (2 * C128)
    scratch = piece * pixels * scratch_per_pixel(modes, slices, subpixel, refine, nearfield)
    reading = 2 * piece * pixels * F32 if residency != "device" else 0
    # the call holds the targets, the state and the terms received; then first the update
    # (and a new state), later the terms it returns and, beside them, one sub-batch's
    # scratch: the transient is what exceeds the returned terms at either time
    work = max(update + state - terms, scratch + reading)
    steps = math.ceil(n_positions / batch)
    load = TaskMemory("ptycho-shard", workers, input_bytes=0, output_bytes=targets,
                      transient_bytes=shard * pixels * F32 if residency == "device" else 0,
                      read_bytes=targets)
    call = TaskMemory("ptycho-step", steps * workers, input_bytes=targets + state + terms,
                      output_bytes=terms, transient_bytes=work,
                      read_bytes=piece * pixels * F32 if residency == "disk" else 0)
    if backend != "cupy":
        return [load, call]
    on_host = targets if residency == "host" else 0
    return [
        TaskMemory("ptycho-shard", workers, input_bytes=0, output_bytes=on_host,
                   transient_bytes=shard * pixels * F32 if residency != "disk" else 0,
                   read_bytes=targets, device_bytes=targets - on_host),
        TaskMemory("ptycho-step", steps * workers, input_bytes=on_host + terms,
                   output_bytes=terms, transient_bytes=reading, read_bytes=call.read_bytes,
                   device_bytes=call.peak_bytes - on_host),
    ]


def simulate_stages(sim: Simulation) -> list[TaskMemory]:
    """Per-task memory of a simulation: pattern chunks (object patches of every slice, the
    forward model's waves per mode, FFT) and the truth object's row bands, bytes."""
    data = sim.stack["data"].data
    k = data.shape[-1]
    frames = math.prod(max(c) for c in data.chunks[:-2]) * k * k
    out = frames * data.dtype.itemsize
    patch = _largest_patch(sim.truth["top_left"].values, data.chunks[:-2], k)
    probe, obj = sim.truth["probe"], sim.truth["object"]
    modes = probe.shape[0] if probe.ndim == 3 else 1
    slices = obj.shape[0] if obj.ndim == 3 else 1
    forward = intensities_per_pixel(modes, slices, bool(sim.stack.attrs.get("subpixel")))
    patterns = TaskMemory("simulate-patterns", math.prod(len(c) for c in data.chunks),
                          0, out, transient_bytes=frames * (forward + F64)
                          + slices * patch * (C64 + 4 * F64), write_bytes=out)
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
