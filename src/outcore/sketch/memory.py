"""Memory model of a sketch for ``outcore.plan``, and the block size a plan chooses.

A read task holds its block of the stack (``r`` items of ``m`` pixels, in the store's
dtype) and the ``(m, l)`` float64 panel ``V`` it multiplies by, and gives a float64 term:
``(m, l)`` (with the column sums in the first read) or, in the last read, the ``(r, l)``
panel ``B = A V`` and its ``l x l`` R factor. While it reads, zarr holds the encoded bytes
and the decoded buffer (``plan.zarr_read_bytes``); while it multiplies, one float64 slab of
rows (``kernels.cpu.SLAB_BYTES``), its ``(rows, l)`` product and an ``(l, m)`` product of
its transpose: the larger of the two is the task's scratch. Terms are added in a fixed tree,
``FAN_IN`` at a time. ``--denoise`` writes each block back at rank ``k``. On the cupy
backend a task's block, panels and slab are device bytes too.

Where the workers' memory has room for the decoded stack besides those tasks, the plan holds
it there after the first read (``Plan.config["hold"]``): the store is read and decoded once
instead of ``q + 2`` times, and each worker holds its share of the blocks across tasks
(``held_bytes``, the plan's ``resident_bytes``).

The client holds the pixel panels (the test matrix, ``V``, the summed term and its QR
factor, the right factors) and the gathered ``(items, l)`` panel with the left factors:
``client_bytes``, named in the plan's notes.
"""

from __future__ import annotations

import math

import numpy as np
from dask.utils import format_bytes

from outcore.plan import F64, Plan, Resources, TaskMemory, zarr_read_bytes
from outcore.sketch.kernels import cpu, gpu
from outcore.sketch.kernels.arrays import slab_rows
from outcore.sketch.stack import Stack, item_chunkings

#: Terms one task of the reduction tree adds together.
FAN_IN = 4
#: The largest block of the stack a task is given when larger ones would fit, bytes: larger
#: blocks make no faster reads, and fewer of them leave workers idle.
TASK_BYTES = 64 * 2**20
#: Blocks per worker thread a plan keeps at least, where the stack has that many.
TASKS_PER_THREAD = 2
#: A worker's share of the held blocks over an even share: the scheduler places each block
#: where it was read, so shares differ by a few blocks.
HELD_IMBALANCE = 1.25


def denoised_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype of the rank-``k`` stack of a ``dtype`` stack: itself for floats, else
    float32 (a low-rank stack of counts is not whole counts)."""
    return np.dtype(dtype) if np.dtype(dtype).kind == "f" else np.dtype("float32")


def _product_scratch(rows: int, pixels: int, width: int, slab_bytes: int) -> int:
    """Bytes a product holds besides its block, panel and term: the float64 slab, the
    slab's ``(rows, l)`` product and an ``(l, m)`` product of its transpose."""
    slab = min(rows, slab_rows(pixels, slab_bytes))
    return F64 * (slab * pixels + slab * width + pixels * width)


def memory_model(stack: Stack, item_chunk: tuple[int, ...], width: int, rank: int,
                 power_iterations: int, *, denoise: bool = False, backend: str = "numpy",
                 held: bool = False) -> list[TaskMemory]:
    """The stages of a sketch of ``stack`` read in blocks of ``item_chunk`` items: width
    ``l`` = ``width``, ``rank`` components kept, ``power_iterations`` reads of ``A^T A``
    after the first, the last read and, with ``denoise``, the rank-``k`` store. Bytes per
    task (see the module's docstring). ``held``: the blocks stay in the workers' memory
    after the first read, so only its tasks read the store (the later passes' tasks are
    the ``-held`` stages, the same bytes without the read)."""
    rows, m = math.prod(item_chunk), stack.pixels
    tasks = stack.tasks(item_chunk)
    chunk = rows * m * stack.dtype.itemsize
    panel = F64 * m * width
    on_device = backend == "cupy"
    slab = gpu.SLAB_BYTES if on_device else cpu.SLAB_BYTES
    scratch = _product_scratch(rows, m, width, slab)
    read = zarr_read_bytes(chunk)
    left = F64 * rows * width

    def reading(name: str, count: int, output: int, reads: bool = True) -> TaskMemory:
        read_bytes = chunk if reads else 0
        if on_device:
            return TaskMemory(name, count, chunk + panel, output, read, read_bytes=read_bytes,
                              device_bytes=chunk + panel + output + scratch)
        return TaskMemory(name, count, chunk + panel, output, max(read, scratch),
                          read_bytes=read_bytes)

    term = panel + F64 * (m + 1)
    combines = max(1, math.ceil((tasks - 1) / (FAN_IN - 1)))
    multiplies = [reading("read-and-multiply", tasks * (power_iterations + 1), term)]
    if held:
        multiplies = [reading("read-and-multiply", tasks, term)]
        if power_iterations:
            multiplies.append(reading("multiply-held", tasks * power_iterations, term, False))
    stages = [
        *multiplies,
        TaskMemory("add-terms", combines * (power_iterations + 1), FAN_IN * term, term),
        reading("project-held" if held else "read-and-project", tasks,
                left + F64 * width * width, not held),
        TaskMemory("add-r-factors", combines, FAN_IN * F64 * width * width,
                   F64 * width * width, FAN_IN * F64 * width * width),
    ]
    if denoise:
        out = rows * m * denoised_dtype(stack.dtype).itemsize
        inputs = F64 * (rows * rank + (rank + 1) * m)
        slab64 = F64 * min(rows, slab_rows(m, slab)) * m
        write = zarr_read_bytes(out)
        stages.append(TaskMemory("denoise", tasks, inputs, out, max(write, slab64),
                                 write_bytes=out,
                                 device_bytes=inputs + out + slab64 if on_device else 0))
    return stages


def client_bytes(stack: Stack, width: int, rank: int) -> int:
    """Bytes the client holds at once: four ``(m, l)`` float64 pixel panels (the test
    matrix, ``V``, the summed term and its QR factor), the ``(rank, m)`` right factors, the
    gathered ``(items, l)`` panel ``B`` and the ``(items, rank)`` left factors."""
    return F64 * (stack.pixels * (4 * width + rank) + stack.items * (width + rank))


def held_bytes(stack: Stack, item_chunk: tuple[int, ...], workers: int) -> int:
    """Bytes of decoded blocks one worker holds when the stack is held in the workers'
    memory: its even share of the blocks of ``item_chunk`` items, times ``HELD_IMBALANCE``,
    at most the whole stack."""
    tasks = stack.tasks(item_chunk)
    share = min(tasks, math.ceil(HELD_IMBALANCE * tasks / workers))
    return share * math.prod(item_chunk) * stack.pixels * stack.dtype.itemsize


def plan_fixes(stack: Stack) -> list[str]:
    """What shrinks a sketch's tasks, named when no plan fits: the store's blocks are the
    smallest a task can read, so smaller ones are a stack saved in smaller chunks."""
    item = stack.item_dims[0]
    return [f"save the stack in smaller chunks along its items and decompose that (e.g."
            f" outcore.save(ds, path, chunks={{'{item}': N}}))",
            "use a smaller rank= or oversample= (the pixel panels of every task)"]


def plan_sketch(stack: Stack, resources: Resources, width: int, rank: int,
                power_iterations: int, *, denoise: bool = False,
                item_chunk: tuple[int, ...] | None = None, hold: bool | None = None) -> Plan:
    """The plan of a sketch on ``resources``, computing nothing and checking nothing (its
    caller checks it, with the fixes in its own words).

    The blocks: ``item_chunk`` items (by item dim) when given, else the largest chunking of
    ``item_chunkings(stack)`` that fits, at most ``TASK_BYTES`` of the stack a block and at
    least ``TASKS_PER_THREAD`` blocks a worker thread where the store's chunks give that
    many (the smallest when none fits). Whether the decoded stack stays in the workers'
    memory after the first read: ``hold``, else where a memory limit is known and that plan
    fits too. The chunking rides in ``Plan.choices`` (a tuple of items per item dim) and
    ``Plan.config`` (the stack's ``var``, ``task_chunks`` and ``hold``)."""
    chunkings = item_chunkings(stack) if item_chunk is None else [tuple(item_chunk)]
    threads = resources.workers * resources.threads_per_worker
    least = min(TASKS_PER_THREAD * threads, stack.tasks(chunkings[0]))
    allowed = [c for i, c in enumerate(chunkings)
               if i == 0 or (math.prod(c) * stack.pixels * stack.dtype.itemsize <= TASK_BYTES
                             and stack.tasks(c) >= least)]

    def plan_for(chunk: tuple[int, ...], held: bool = False) -> Plan:
        stages = memory_model(stack, chunk, width, rank, power_iterations, denoise=denoise,
                              backend=resources.backend, held=held)
        passes = power_iterations + 2
        reads = (f"the stack read once and held in the workers' memory for {passes} passes"
                 if held else f"{passes} reads of the stack")
        note = (f"blocks of {math.prod(chunk)} items ({stack.tasks(chunk)} tasks a read,"
                f" {reads}); the client holds about"
                f" {format_bytes(client_bytes(stack, width, rank))} of panels")
        return Plan.of(stages, resources, notes=[note], choices=chunk,
                       resident_bytes=held_bytes(stack, chunk, resources.workers) if held else 0,
                       config={"var": stack.var, "task_chunks": stack.chunks(chunk),
                               "hold": held})

    streaming = plan_for(allowed[0])
    for chunk in allowed[1:]:  # the largest that fits: a larger block never needs less
        larger = plan_for(chunk)
        if not larger.fits:
            break
        streaming = larger
    if hold is False or (hold is None and (resources.memory_limit is None
                                           or not streaming.fits)):
        return streaming
    held = plan_for(streaming.choices, held=True)
    return held if hold or held.fits else streaming
