"""The one place that decides a reconstruction's blocks, and the plan they make.

A reconstruction (or a simulated scan) is cut into tasks of some views and some z-planes
(``outcore.tomo.memory.Cut``). :func:`suggest_blocks` picks the cut of least traffic whose
projector tasks fit a memory limit; :func:`fitting_cut` then thins it until every stage of
the method (its ``stages`` in the method table, ``outcore.tomo.reconstruction.methods``)
fits the workers too; :func:`running_resources` says what they are when the caller gives
no cluster (the process's default client, else :data:`DEFAULT_LIMIT` on one worker).
:func:`plan` returns a reconstruction's plan with these choices (a :class:`Solve`: the cut,
and for an iterative method where its vectors live and how often it checkpoints);
:func:`input_stages` lists what the input goes through before the solver (the raw read,
the corrections, the centre search). Nothing here computes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np
import xarray as xr

from outcore.plan import Plan, Resources, TaskMemory
from outcore.tomo.center.axis import center_rows
from outcore.tomo.corrections import steps
from outcore.tomo.geometry import Geometry
from outcore.tomo.memory import (
    TOMO_WORKER_BASELINE_BYTES,
    Chunks,
    Cut,
    blocks,
    center_stages,
    memory_model,
    state_bytes,
)

__all__ = ["CHECKPOINT_EVERY", "DEFAULT_LIMIT", "STATES", "MethodModel", "Solve",
           "fitting_cut", "fitting_slabs", "input_stages", "method_plan", "plan",
           "running_resources", "store_chunks", "suggest_blocks"]

#: Memory per worker the blocks are chosen for when there is no cluster to ask, bytes.
DEFAULT_LIMIT = 2 * 2**30
#: Where an iterative solver's vectors live: ``auto`` (memory when the plan fits), the
#: workers' ``memory``, or zarr on ``disk``.
STATES: tuple[str, ...] = ("auto", "memory", "disk")
#: Iterations between checkpoints when none is asked: every one when the vectors are in
#: zarr anyway, every tenth when they are in memory.
CHECKPOINT_EVERY = {"disk": 1, "memory": 10}
#: Stages whose tasks hold one block of views whatever the slab (thinner slabs do not help).
VIEW_BLOCK_STAGES = frozenset({"ramp-filter", "update-projections"})

Stages = Callable[[Cut, Chunks | None], list[TaskMemory]]


class MethodModel(Protocol):
    """What a plan needs of a method (``methods.Method``): its ``stages(cut, stored)``
    (``stored``: the input's chunks), how it chooses its blocks (``fit``, with
    :func:`fitting_cut`'s arguments), and for an iterative one the ``vectors`` it holds at
    once (volumes, projections)."""

    stages: Stages
    fit: Callable[..., Cut]
    vectors: tuple[int, int] | None


@dataclass(frozen=True)
class Solve:
    """What a reconstruction's plan chose: the cut (its blocks), and for an iterative method
    where the vectors live and the iterations between checkpoints; ``prepared`` is the work
    the plan was made for (``outcore.tomo.volumes``), handed to its execution."""

    cut: Cut
    state: str | None = None
    checkpoint_every: int | None = None
    prepared: Any = None


def running_resources(backend: str = "numpy") -> Resources:
    """The workers a graph built now will run on: those of this process's default client
    (the one the user started), else one worker of :data:`DEFAULT_LIMIT`."""
    import distributed

    try:
        client = distributed.get_client()
    except ValueError:
        return Resources(1, 1, DEFAULT_LIMIT, backend)
    return Resources.of_client(client, backend)


def _halvings(n: int) -> list[int]:
    """``n``, ``ceil(n / 2)``, ``ceil(n / 4)``, ... down to 1."""
    out = [n]
    while out[-1] > 1:
        out.append(math.ceil(out[-1] / 2))
    return out


def suggest_blocks(geometry: Geometry, volume_shape: tuple[int, int, int],
                   memory_limit: int | str, *, partition: str = "views", workers: int = 1,
                   threads_per_worker: int = 1, dtype: Any = np.float32,
                   split_every: int = 4) -> tuple[int, int]:
    """``(views_per_block, slab)`` that fit ``memory_limit`` per worker, least traffic first.

    Among the block sizes (halvings of the view count and of ``nz``) whose projector plan
    fits, picks the one that writes the fewest bytes of partial results (the partial
    projections of every slab plus the partial slabs of every view block), preferring enough
    tasks to keep ``workers * threads_per_worker`` busy. Raises ``PlanError`` when even one
    view on one plane does not fit.
    """
    item = np.dtype(dtype).itemsize
    nz, ny, nx = volume_shape
    nu = geometry.detector_shape[1]
    busy = workers * threads_per_worker

    def projector_plan(views: int, slab: int) -> Plan:
        return Plan(memory_model(geometry, volume_shape, partition, views, slab, dtype=dtype,
                                 split_every=split_every),
                    workers=workers, threads_per_worker=threads_per_worker,
                    memory_limit=memory_limit, baseline_bytes=TOMO_WORKER_BASELINE_BYTES)

    best: tuple[tuple, tuple[int, int]] | None = None
    for slab in _halvings(nz):
        bands = blocks(geometry, volume_shape, partition, 1, slab).bands
        for views in _halvings(geometry.n_views):
            if not projector_plan(views, slab).fits:
                continue
            n_blocks = math.ceil(geometry.n_views / views)
            tasks = n_blocks * len(bands)
            traffic = item * (geometry.n_views * nu * sum(b - a for a, b in bands)
                              + n_blocks * nz * ny * nx)
            score = (tasks < busy, traffic, tasks)
            if best is None or score < best[0]:
                best = (score, (views, slab))
    if best is None:
        projector_plan(1, 1).check(["use a smaller volume or detector"])
        raise AssertionError("unreachable: the smallest blocks fit after all")
    return best[1]


def method_plan(cut: Cut, stages: Stages, resources: Resources, stored: Chunks | None = None,
                vectors: tuple[int, int] | None = None, extra: Sequence[TaskMemory] = ()
                ) -> Plan:
    """The plan of a method's ``stages`` with ``cut``'s blocks on ``resources``, reading the
    input stored in chunks ``stored`` after the ``extra`` stages (the input's read and
    corrections); with ``vectors`` (an iterative
    solver's volumes and projections held at once in memory) each worker also holds its
    share of them."""
    held = state_bytes(cut, vectors, resources.workers) if vectors else 0
    return Plan.of([*extra, *stages(cut, stored)], resources,
                   baseline_bytes=TOMO_WORKER_BASELINE_BYTES, resident_bytes=held)


def fitting_cut(geometry: Geometry, shape: tuple[int, int, int], partition: str,
                stages: Stages, resources: Resources, views_per_block: int | None = None,
                slab: int | None = None, dtype: Any = np.float32,
                stored: Chunks | None = None) -> Cut:
    """The cut whose blocks fit ``resources``: the blocks given, else :func:`suggest_blocks`'
    (for the projector's own tasks), with the view blocks halved while the largest of the
    method's ``stages`` is one held per view block (``VIEW_BLOCK_STAGES``), else the slab,
    until they fit too. Without a memory limit the blocks are chosen for
    :data:`DEFAULT_LIMIT`."""
    limit = resources.memory_limit or DEFAULT_LIMIT
    views, planes = views_per_block, slab
    if views is None or planes is None:
        found = suggest_blocks(geometry, shape, limit, partition=partition,
                               workers=resources.workers,
                               threads_per_worker=resources.threads_per_worker, dtype=dtype)
        views, planes = views or found[0], planes or found[1]
    limited = replace(resources, memory_limit=limit)
    cut = Cut(geometry, shape, partition, views, planes, dtype, backend=resources.backend)
    while not (fitted := method_plan(cut, stages, limited, stored)).fits:
        thinner_views = views_per_block is None and cut.views_per_block > 1
        thinner_slab = slab is None and cut.slab > 1
        if thinner_views and (fitted.largest_task.name in VIEW_BLOCK_STAGES
                              or not thinner_slab):
            cut = cut.with_blocks(math.ceil(cut.views_per_block / 2), cut.slab)
        elif thinner_slab:
            cut = cut.with_blocks(cut.views_per_block, math.ceil(cut.slab / 2))
        else:
            break
    return cut


def fitting_slabs(geometry: Geometry, shape: tuple[int, int, int], partition: str | None,
                  stages: Stages, resources: Resources, views_per_block: int | None = None,
                  slab: int | None = None, dtype: Any = np.float32,
                  stored: Chunks | None = None) -> Cut:
    """The cut of a method whose tasks take every view of their slab's band of detector
    rows (gridrec's slabs of whole sinograms; ``partition`` and ``views_per_block`` do not
    apply): ``slab`` planes when given, else the most that keep ``resources.workers *
    threads_per_worker`` slabs busy and whose ``stages`` fit ``resources`` (without a
    memory limit, :data:`DEFAULT_LIMIT`), halving down to 1 (where the plan then
    refuses)."""
    busy = max(1, resources.workers * resources.threads_per_worker)
    cut = Cut(geometry, shape, "space", geometry.n_views, slab or math.ceil(shape[0] / busy),
              dtype, backend=resources.backend)
    limited = replace(resources, memory_limit=resources.memory_limit or DEFAULT_LIMIT)
    while slab is None and cut.slab > 1 and not method_plan(cut, stages, limited,
                                                            stored).fits:
        cut = cut.with_blocks(cut.views_per_block, math.ceil(cut.slab / 2))
    return cut


def input_stages(read: Sequence[TaskMemory], corrections: Sequence[steps.Correction],
                 raw: xr.Dataset, searched: xr.Dataset | None, geometry: Geometry
                 ) -> list[TaskMemory]:
    """The stages before the solver's: ``read`` (a raw scan's read-and-normalise), the
    corrections of ``raw`` (the input as read) and, when ``searched`` is given (the centre
    found in the run), the centre search on it."""
    stages = [*read, *steps.memory(corrections, raw)]
    if searched is not None:
        stages += center_stages(searched["projections"], len(center_rows(geometry)))
    return stages


def store_chunks(stored: xr.DataArray) -> Chunks | None:
    """The chunks the input is read in (None: held in memory, nothing read)."""
    return getattr(stored.data, "chunks", None)


def plan(geometry: Geometry, shape: tuple[int, int, int], method: MethodModel,
         resources: Resources, *, partition: str, views_per_block: int | None,
         slab: int | None, stored: xr.DataArray, extra: Sequence[TaskMemory], state: str,
         checkpoint_every: int | None, prepared: Any = None) -> Plan:
    """The plan of ``method`` on ``resources`` with its choices (a :class:`Solve`): the
    given blocks or those that fit, reading ``stored`` (the input's projections, as read)
    after the ``extra`` stages (:func:`input_stages`); for an iterative method the vectors
    in memory (``state`` ``memory``, or ``auto`` when that plan fits) or in zarr (``disk``),
    and a checkpoint every ``checkpoint_every`` iterations (default
    :data:`CHECKPOINT_EVERY`)."""
    chunks = store_chunks(stored)
    cut = method.fit(geometry, shape, partition, method.stages, resources, views_per_block,
                     slab, stored.dtype, chunks)
    if method.vectors is None:
        return replace(method_plan(cut, method.stages, resources, chunks, extra=extra),
                       choices=Solve(cut, prepared=prepared), config=cut.config())
    if state == "auto":
        in_memory = method_plan(cut, method.stages, resources, chunks, method.vectors,
                                extra=extra)
        state = "memory" if in_memory.fits else "disk"
    every = checkpoint_every or CHECKPOINT_EVERY[state]
    held = method.vectors if state == "memory" else None
    return replace(method_plan(cut, method.stages, resources, chunks, held, extra=extra),
                   choices=Solve(cut, state, every, prepared),
                   config={**cut.config(), "state": state, "checkpoint_every": every})
