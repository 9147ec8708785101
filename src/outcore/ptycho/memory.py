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

from outcore.plan import TaskMemory

_C64, _C128, _F32, _F64 = 8, 16, 4, 8
#: Scratch of ``batch_terms`` per detector pixel per position, bytes (see the module doc).
SCRATCH_PER_PIXEL = 40


def memory_model(n_positions: int, k: int, object_shape: tuple[int, int], workers: int,
                 residency: str, sub_batch: int, batch_size: int | None = None
                 ) -> list[TaskMemory]:
    """The stages of a reconstruction of ``n_positions`` patterns of ``k x k`` on
    ``workers`` workers (host bytes; on a GPU the targets of ``device`` residency and the
    scratch are device bytes). Feed them to ``outcore.plan.Plan``."""
    shard = math.ceil(n_positions / max(workers, 1))
    pixels = k * k
    resident = shard * pixels * _F32 if residency in ("device", "host") else 0
    object_pixels = math.prod(object_shape)
    state = object_pixels * _C64 + pixels * _C64
    terms = object_pixels * _C128 + pixels * (_C128 + _F64)
    batch = min(batch_size or n_positions, n_positions)
    piece = min(sub_batch, batch, shard)
    reading = 2 * piece * pixels * _F32 if residency != "device" else 0
    scratch = piece * pixels * SCRATCH_PER_PIXEL + reading + terms
    step_scratch = object_pixels * (_F64 + _C128 + _F64)
    steps = math.ceil(n_positions / batch)
    return [
        TaskMemory("ptycho-shard", workers, input_bytes=0, output_bytes=resident,
                   transient_bytes=shard * pixels * _F32 if residency == "device" else 0,
                   read_bytes=resident),
        TaskMemory("ptycho-terms", steps * workers, input_bytes=resident + 2 * state,
                   output_bytes=terms, transient_bytes=scratch,
                   read_bytes=piece * pixels * _F32 if residency == "disk" else 0),
        TaskMemory("ptycho-step", steps, input_bytes=resident + 2 * state + terms,
                   output_bytes=state, transient_bytes=step_scratch + batch * 16),
    ]
