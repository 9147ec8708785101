"""The plan of a reconstruction: blocks that fit the workers, and where the vectors live.

:func:`input_stages` lists what the reconstruction does to its input before the solver (the
raw read, the corrections, the centre search); :func:`plan` chooses the projector's blocks
for the workers' memory (``fitting_projector``), and for sirt and cgls whether the vectors fit
in the workers' memory (``--state auto``) and the iterations between checkpoints, and returns
the plan with these choices (a :class:`Solve`) and their config entries.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import xarray as xr

from outcore.plan import Plan, Resources, TaskMemory
from outcore.tomo.center.axis import center_rows
from outcore.tomo.center.run import center_stages
from outcore.tomo.corrections import steps
from outcore.tomo.geometry import Geometry
from outcore.tomo.memory import method_plan
from outcore.tomo.reconstruction.gridrec import Gridrec, gridrec_plan, suggest_slab
from outcore.tomo.reconstruction.projector import Projector, blocks_config, fitting_projector

METHODS: tuple[str, ...] = ("fbp", "gridrec", "sirt", "cgls")
ITERATIVE: tuple[str, ...] = ("sirt", "cgls")
STATES: tuple[str, ...] = ("auto", "memory", "disk")
#: Iterations between checkpoints when ``--checkpoint-every`` is not given: every one when
#: the vectors are in zarr anyway, every tenth when they are in memory.
CHECKPOINT_EVERY = {"disk": 1, "memory": 10}


@dataclass(frozen=True)
class Solve:
    """What a reconstruction's plan chose: the projector (its blocks), and for sirt and cgls
    where the vectors live and the iterations between checkpoints."""

    projector: Projector | Gridrec
    state: str | None = None
    checkpoint_every: int | None = None


def input_stages(read: Sequence[TaskMemory], corrections: Sequence[steps.Correction],
                 raw: xr.Dataset, searched: xr.Dataset | None, geometry: Geometry
                 ) -> list[TaskMemory]:
    """The stages before the solver's: ``read`` (a raw scan's read-and-normalise), the
    corrections of ``raw`` (the input as read) and, when ``searched`` is given (``--center
    auto``), the centre search on it."""
    stages = [*read, *steps.memory(corrections, raw)]
    if searched is not None:
        stages += center_stages(searched, len(center_rows(geometry)))
    return stages


def store_chunks(stored: xr.DataArray) -> tuple[int, int]:
    """How many chunks the input store has, and the bytes of one."""
    return (math.prod(len(c) for c in stored.chunks),
            math.prod(max(c) for c in stored.chunks) * stored.dtype.itemsize)


def plan(geometry: Geometry, shape: tuple[int, int, int], method: str, resources: Resources,
         *, partition: str, views_per_block: int | None, slab: int | None,
         stored: xr.DataArray, extra: Sequence[TaskMemory], state: str,
         checkpoint_every: int | None) -> Plan:
    """The plan of ``method`` on ``resources`` with its choices (a :class:`Solve`): the
    given blocks or those that fit, reading ``stored`` (the input's projections, as stored)
    after the ``extra`` stages (:func:`input_stages`); for sirt and cgls the vectors in
    memory (``state`` ``memory``, or ``auto`` when that plan fits) or in zarr (``disk``),
    and a checkpoint every ``checkpoint_every`` iterations (default
    :data:`CHECKPOINT_EVERY`)."""
    if method == "gridrec":  # z-slabs of whole sinograms, no projector
        planes = slab or suggest_slab(geometry, shape, resources, stored.dtype,
                                      stored.data.chunks)
        chosen = Gridrec(geometry, shape, planes, backend=resources.backend, dtype=stored.dtype)
        return replace(gridrec_plan(chosen, resources, stored.data.chunks, extra),
                       choices=Solve(chosen), config={"slab": chosen.slab})
    chunks = store_chunks(stored)
    projector = fitting_projector(geometry, shape, partition, method, resources,
                                  views_per_block, slab, stored.dtype, chunks)
    if method not in ITERATIVE:
        return replace(method_plan(projector, method, resources, chunks, extra=extra),
                       choices=Solve(projector), config=blocks_config(projector))
    if state == "auto":
        in_memory = method_plan(projector, method, resources, chunks, "memory", extra=extra)
        state = "memory" if in_memory.fits else "disk"
    every = checkpoint_every or CHECKPOINT_EVERY[state]
    return replace(method_plan(projector, method, resources, chunks, state, extra=extra),
                   choices=Solve(projector, state, every),
                   config={**blocks_config(projector), "state": state,
                           "checkpoint_every": every})
