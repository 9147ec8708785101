"""Memory model of ``fit_dipoles`` for ``outcore.plan``: bytes held by each task, per chunk.

The fit task holds its chunk of the catalog (input), its packed result (output) and the
kernel's scratch (transient). On the host, the Gaussian model runs the compiled loop of
``outcore.fit.kernels.compiled``, one candidate at a time: the chunk's float64 data and
weights, its valid pixels (and, while they are made, two more boolean planes), one normal
matrix and a few numbers per candidate, and one candidate's Jacobian. Otherwise (the PSF
model, or a GPU) the kernel keeps three float64 planes per candidate of the chunk (the data,
its ``sqrt(1 / variance)`` weights and the trial residual) and a few ``p x p`` matrices, and
computes models, starts and Jacobians one block of candidates at a time
(``kernels.cpu.HOST_BLOCK`` on the host, the whole chunk on a GPU). Its peak is reached
while a block's Jacobian is built; a block then holds, per candidate, in float64
(``m = ny * nx``, ``p`` parameters):

- the Jacobian, ``p m`` values, and the block's copies of weights and residual, ``2 m``;
- the model's own scratch: one plane and the per-axis factors for the Gaussian model; two
  planes and about eight interpolation matrices of ``max(ny * py, nx * px)`` values for the
  PSF model.

``tests/test_fit_kernels.py`` checks this count against ``tracemalloc``'s peak of a real
``fit_chunk`` call.
"""

from __future__ import annotations

import math

import numpy as np

from outcore.fit.kernels import fit_columns
from outcore.fit.kernels.cpu import HOST_BLOCK
from outcore.fit.models import get_model
from outcore.plan import F64, TaskMemory

#: Resident memory of a worker process that has fitted Gaussian dipoles on the host, bytes:
#: 382-388 MiB measured (VmHWM, ``peak_worker_rss``) after a few chunks of 256 stamps,
#: against 227 MiB with the array code: ``import numba`` adds about 110 MiB (llvmlite's
#: LLVM), loading the compiled loop from numba's cache about 60 MiB. Plans of the Gaussian
#: model on the numpy backend count it in place of ``outcore.plan.WORKER_BASELINE_BYTES``.
FIT_WORKER_BASELINE_BYTES = 390 * 2**20
#: Bytes of one status name in the result (numpy unicode, 4 bytes a character).
_STATUS_BYTES = 4 * 15


def kernel_transient_bytes(candidates: int, stamp_shape: tuple[int, int], model: str = "gaussian",
                           psf_shape: tuple[int, int] | None = None,
                           per_candidate_psf: bool = False, backend: str = "numpy") -> int:
    """Peak scratch bytes of one ``fit_chunk`` call on ``candidates`` stamps, output excluded.

    ``psf_shape`` is the PSF's ``(py, px)`` (the stamp's shape when None; PSF model only).
    ``backend="cupy"`` counts device memory, where the whole chunk is one block.
    """
    spec = get_model(model)
    ny, nx = stamp_shape
    m, p = ny * nx, len(spec.params)
    if backend == "numpy" and not spec.needs_psf:  # the compiled loop (kernels.compiled)
        per_candidate = F64 * (2 * m + p * p + 2 * p + 3) + 3 * m
        return per_candidate * candidates + F64 * (p + 4) * m
    block = min(candidates, HOST_BLOCK) if backend == "numpy" else candidates
    per_chunk = 3 * m + 3 * p * p
    per_block = (p + 2) * m
    if spec.needs_psf:
        py, px = psf_shape or stamp_shape
        per_block += 2 * m + 8 * max(ny * py, nx * px)
        if per_candidate_psf:  # the running candidates' PSFs, and the block's normalised ones
            per_chunk += py * px
            per_block += py * px
    else:
        per_block += m + 24 * (ny + nx)
    return F64 * (per_chunk * candidates + per_block * block)


#: Limits of the automatic chunk size: at least ``AUTO_TASKS`` tasks (so that workers share
#: the catalog evenly), stamps of at most ``AUTO_CHUNK_BYTES`` (float64) a task, and at most
#: ``AUTO_CHUNK_MAX`` candidates. A task of the in-process cluster costs 2-4 ms of scheduling
#: here, as much as fitting 50-100 stamps: chunks of 256 made 3x10^4 stamps a 9.9 CPU-s
#: command, chunks of 2048 7.8 CPU-s.
AUTO_TASKS = 8
AUTO_CHUNK_BYTES = 16 * 2**20
AUTO_CHUNK_MAX = 4096


def auto_chunk_size(n_candidates: int, stamp_shape: tuple[int, int]) -> int:
    """Candidates per fit task when none is given: a power of two, the largest within the
    ``AUTO_*`` limits, at least 1."""
    stamp_bytes = F64 * stamp_shape[0] * stamp_shape[1]
    most = min(n_candidates // AUTO_TASKS, AUTO_CHUNK_BYTES // stamp_bytes, AUTO_CHUNK_MAX)
    return 1 << max(int(most), 1).bit_length() - 1


def memory_model(
    n_candidates: int,
    chunk_size: int,
    stamp_shape: tuple[int, int],
    dtype: str | np.dtype = "float64",
    model: str = "gaussian",
    *,
    variance: bool = True,
    mask: bool = False,
    psf_shape: tuple[int, int] | None = None,
    per_candidate_psf: bool = False,
    backend: str = "numpy",
    output_chunk: int | None = None,
) -> list[TaskMemory]:
    """The stages of a ``fit_dipoles`` graph on ``n_candidates`` stamps of ``stamp_shape``.

    ``dtype`` is the catalog's pixel dtype; ``variance`` and ``mask`` say which companions
    the catalog holds. Returns the fit stage (one task per chunk of ``chunk_size``
    candidates) and the column stage that splits each packed result into the output
    variables (what a writer then stores), after joining the packed results into chunks of
    ``output_chunk`` rows when that is given. Feed them to ``outcore.plan.Plan``. With
    ``backend="cupy"`` the fit's scratch is device memory (see ``kernel_transient_bytes``),
    as are the chunk's copy and its result there: the fit stage's ``device_bytes``.
    """
    chunk = min(chunk_size, n_candidates)
    tasks = math.ceil(n_candidates / chunk)
    ny, nx = stamp_shape
    pixel_bytes = np.dtype(dtype).itemsize * (1 + variance) + mask
    psf_bytes = F64 * math.prod(psf_shape or stamp_shape) if per_candidate_psf else 0
    inputs = chunk * (ny * nx * pixel_bytes + psf_bytes)
    packed = chunk * len(fit_columns(model)) * F64
    transient = kernel_transient_bytes(chunk, stamp_shape, model, psf_shape, per_candidate_psf,
                                       backend)
    rows = min(output_chunk or chunk, n_candidates)
    joined = rows * len(fit_columns(model)) * F64
    columns = joined + rows * _STATUS_BYTES
    on_device = backend == "cupy"
    return [
        TaskMemory("fit-dipoles", tasks, input_bytes=inputs, output_bytes=packed,
                   transient_bytes=0 if on_device else transient, read_bytes=inputs,
                   device_bytes=inputs + packed + transient if on_device else 0),
        TaskMemory("fit-columns", math.ceil(n_candidates / rows), input_bytes=joined,
                   output_bytes=columns, transient_bytes=joined if rows != chunk else 0,
                   write_bytes=columns),
    ]
