"""Re-slicing a scan: projections ``(view, v, u)`` chunked by view <-> sinogram chunks.

A slice-wise step (ring removal) needs every view of a detector row in one task: a
*sinogram chunk* holds all views, a few rows ``v`` and all columns ``u``. The scan arrives
chunked by view (a block of whole projections per chunk), so going there and back is an
all-to-all exchange. It runs through dask's own task-based rechunk (``method="tasks"``):
dask plans it (``dask.array.rechunk.plan_rechunk``) as one or more steps, each a layer of
*split* tasks (a slice of an old chunk) and *merge* tasks (new chunks concatenated from
those slices); no task holds more than an old chunk or a new chunk and its pieces, so a
scan larger than the cluster's memory re-slices with each worker under its limit (what is
waiting for its merge is held, or spilled to disk by dask past the worker's target).

``stages`` turns dask's own plan into ``TaskMemory`` stages for ``outcore.plan``;
``sinogram_rows`` picks the rows per sinogram chunk for a memory limit.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence

import dask
import dask.array as da
from dask.array.rechunk import intersect_chunks, plan_rechunk
from dask.utils import parse_bytes

from outcore.plan import WORKER_BASELINE_BYTES, Plan, TaskMemory

Chunks = tuple[tuple[int, ...], ...]


def sinogram_chunks(shape: Sequence[int], rows: int) -> Chunks:
    """Chunks of ``shape (view, v, u)`` with every view, ``rows`` detector rows, every column."""
    n_views, nv, nu = (int(n) for n in shape)
    rows = max(1, min(int(rows), nv))
    return ((n_views,), tuple(min(rows, nv - start) for start in range(0, nv, rows)), (nu,))


def _limit(old: Chunks, new: Chunks, itemsize: int) -> int:
    """dask's block-size limit for the rechunk: intermediates no larger than either end."""
    return max(math.prod(max(c) for c in old), math.prod(max(c) for c in new)) * itemsize


def rechunk(array: da.Array, chunks: Chunks) -> da.Array:
    """``array`` in ``chunks`` through dask's task rechunk, its intermediates no larger than
    the larger of an old and a new chunk (the sizes ``stages`` counts)."""
    chunks = da.core.normalize_chunks(chunks, array.shape, dtype=array.dtype)
    if chunks == array.chunks:
        return array
    return array.rechunk(chunks, method="tasks",
                         block_size_limit=_limit(array.chunks, chunks, array.dtype.itemsize))


def to_sinograms(projections: da.Array, rows: int) -> da.Array:
    """``projections (view, v, u)`` re-sliced into sinogram chunks of ``rows`` rows."""
    return rechunk(projections, sinogram_chunks(projections.shape, rows))


def to_projections(sinograms: da.Array, chunks: Chunks) -> da.Array:
    """Sinogram-chunked data back in projection ``chunks`` (e.g. the scan's own)."""
    return rechunk(sinograms, chunks)


def stages(old: Chunks, new: Chunks, itemsize: int, name: str) -> list[TaskMemory]:
    """The tasks of re-chunking ``old`` into ``new`` as dask plans it, for ``outcore.plan``.

    For each step of ``plan_rechunk``: ``NAME-split`` (one task per slice of an old chunk
    that is not the whole chunk: it holds the old chunk and the slice) and ``NAME-merge``
    (one per new chunk made of several slices: the slices and their concatenation), each at
    its largest task; a step where nothing is cut or joined has no tasks and no stage.
    """
    old = tuple(tuple(int(n) for n in c) for c in old)
    new = tuple(tuple(int(n) for n in c) for c in new)
    if old == new:
        return []
    out: list[TaskMemory] = []
    steps = plan_rechunk(old, new, itemsize, block_size_limit=_limit(old, new, itemsize))
    for index, step in enumerate(steps):
        tag = name if len(steps) == 1 else f"{name}-{index + 1}"
        splits = merges = split_bytes = piece_bytes = merge_bytes = 0
        new_blocks = itertools.product(*(range(len(c)) for c in step))
        for block, pieces in zip(new_blocks, intersect_chunks(old, step), strict=True):
            for piece in pieces:  # ((old block index, slice) per dimension)
                source = [old[d][i] for d, (i, _) in enumerate(piece)]
                sizes = [cut.stop - cut.start for _, cut in piece]
                if sizes != source:
                    splits += 1
                    split_bytes = max(split_bytes, math.prod(source) * itemsize)
                    piece_bytes = max(piece_bytes, math.prod(sizes) * itemsize)
            if len(pieces) > 1:
                merges += 1
                merge_bytes = max(merge_bytes, math.prod(
                    step[d][i] for d, i in enumerate(block)) * itemsize)
        if splits:
            out.append(TaskMemory(f"{tag}-split", splits, split_bytes, piece_bytes))
        if merges:
            out.append(TaskMemory(f"{tag}-merge", merges, merge_bytes, merge_bytes))
        old = step
    return out


def round_trip_stages(chunks: Chunks, shape: Sequence[int], rows: int,
                      itemsize: int) -> tuple[list[TaskMemory], list[TaskMemory]]:
    """The stages of re-slicing ``chunks`` to sinograms of ``rows`` rows and of coming back."""
    sinograms = sinogram_chunks(shape, rows)
    return (stages(chunks, sinograms, itemsize, "to-sinograms"),
            stages(sinograms, chunks, itemsize, "to-projections"))


def candidate_rows(nv: int) -> list[int]:
    """Rows per sinogram chunk to try: powers of two below ``nv``, and ``nv``."""
    return sorted({*(2**k for k in range(max(1, nv).bit_length()) if 2**k < nv), nv})


def sinogram_rows(chunks: Chunks, shape: Sequence[int], itemsize: int,
                  memory_limit: int | str | None, threads_per_worker: int,
                  task_stages: Callable[[int], list[TaskMemory]],
                  baseline_bytes: int = WORKER_BASELINE_BYTES) -> int:
    """The most rows per sinogram chunk whose re-slice there and back, with the stages
    ``task_stages(rows)`` of the work on the sinograms, fits ``memory_limit`` per worker
    (``threads_per_worker`` tasks at once) and keeps a sinogram chunk within dask's
    ``array.chunk-size``. Returns 1 when nothing fits (the plan then refuses it)."""
    n_views, nv, nu = (int(n) for n in shape)
    target = parse_bytes(dask.config.get("array.chunk-size"))
    best = 1
    for rows in candidate_rows(nv):
        if rows > 1 and n_views * rows * nu * itemsize > target:
            break
        there, back = round_trip_stages(chunks, shape, rows, itemsize)
        plan = Plan([*there, *task_stages(rows), *back], threads_per_worker=threads_per_worker,
                    memory_limit=memory_limit, baseline_bytes=baseline_bytes)
        if not plan.fits:
            break
        best = rows
    return best

