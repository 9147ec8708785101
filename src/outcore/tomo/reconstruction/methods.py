"""The reconstruction methods as a table: each name, the function that solves and its memory.

``METHODS`` maps a method's name (``method=`` of ``outcore.tomo.reconstruct``, ``--method``
of ``outcore tomo reconstruct``) to a :class:`Method`: ``solve(projections, cut, solving)``
returns the volume (dask; lazy for an analytic method, read from the last iteration's store
for an iterative one, which computes its iterations) and its metrics, working in the blocks
of ``cut`` (``outcore.tomo.memory.Cut``); ``stages(cut, stored)`` counts its tasks' memory
for the plan, reading the input stored in chunks ``stored`` (``outcore.tomo.memory``);
``fit`` chooses its blocks (default the projector's, ``planning.fitting_cut``; gridrec's
slabs of whole sinograms, ``planning.fitting_slabs``) and ``blocks`` are the keywords that
fix them; ``projector`` says it runs the projector's kernels (compiled when the plan is
made), ``parallel_only`` that it refuses a cone-beam scan; ``vectors`` are the volumes
and projections an iterative solver holds at once (None: not iterative: no workdir,
checkpoints or state).
Adding a method is its module and one line here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dask.array as da

from outcore.plan import TaskMemory
from outcore.tomo.memory import Cut, fbp_stages, gridrec_stages, iterative_stages
from outcore.tomo.reconstruction.gridrec import Gridrec
from outcore.tomo.reconstruction.planning import fitting_cut, fitting_slabs
from outcore.tomo.reconstruction.projector import Projector
from outcore.tomo.reconstruction.solvers import WINDOWS, cgls, fbp, sirt

__all__ = ["ITERATIVE", "METHODS", "WINDOWS", "Method", "Solving"]


@dataclass(frozen=True)
class Solving:
    """What a solve is asked besides its input: the ramp filter's ``window`` (analytic); the
    total ``iterations``, ``nonnegative`` (SIRT), the ``workdir`` of the vectors and
    checkpoints, ``checkpoint_every``, ``resume`` from the workdir's checkpoint,
    ``in_memory`` vectors and a ``callback(iteration, residual)`` (iterative)."""

    window: str = "ram-lak"
    iterations: int = 0
    nonnegative: bool = False
    workdir: Path | None = None
    checkpoint_every: int = 1
    resume: bool = False
    in_memory: bool = False
    callback: Callable[[int, float], None] | None = None


Solved = tuple[da.Array, dict[str, Any]]


@dataclass(frozen=True)
class Method:
    """A reconstruction method: how it solves, what its tasks hold, how it chooses its
    blocks (and the keywords that fix them), the vectors it keeps, whether it holds for
    parallel rays only."""

    solve: Callable[[da.Array, Cut, Solving], Solved]
    stages: Callable[[Cut, tuple[tuple[int, ...], ...] | None], list[TaskMemory]]
    fit: Callable[..., Cut] = fitting_cut
    vectors: tuple[int, int] | None = None
    blocks: tuple[str, ...] = ("partition", "views_per_block", "slab")
    projector: bool = True
    parallel_only: bool = False


def solve_fbp(projections: da.Array, cut: Cut, solving: Solving) -> Solved:
    """FBP (FDK for a cone beam), lazily, filtered in the projector's blocks."""
    projector = Projector.of(cut)
    projections = projections.rechunk(projector.projection_chunks)
    return fbp(projections, projector, solving.window), {"projector_passes": 1}


def solve_gridrec(projections: da.Array, cut: Cut, solving: Solving) -> Solved:
    """Gridrec (parallel beam, in Fourier space), lazily, in the cut's slabs."""
    return Gridrec.of(cut).reconstruct(projections, solving.window), {"projector_passes": 1}


def _iterative(solver: Callable[..., Any], setup_passes: int,
               options: Callable[[Solving], dict[str, Any]] = lambda solving: {}
               ) -> Callable[[da.Array, Cut, Solving], Solved]:
    """The solve of an iterative ``solver`` (``cgls``, ``sirt``, with its own ``options``)
    that runs ``setup_passes`` projector passes before its first iteration and two an
    iteration."""

    def solve(projections: da.Array, cut: Cut, solving: Solving) -> Solved:
        result = solver(projections, Projector.of(cut), solving.workdir, solving.iterations,
                        checkpoint_every=solving.checkpoint_every, resume=solving.resume,
                        callback=solving.callback, in_memory=solving.in_memory,
                        **options(solving))
        start = result.extra["resumed_from_iteration"]
        residuals = [float(r) for r in result.residuals]
        return result.volume, {
            "projector_passes": (0 if start is not None else setup_passes)
            + 2 * (solving.iterations - (start or 0)),
            "iterations": result.iterations, "resumed_from_iteration": start,
            "residuals": residuals,
            "relative_residual": residuals[-1] / residuals[0]
            if residuals and residuals[0] else None}

    return solve


#: CGLS holds ``x, p`` and the new ``x, s`` (or, in its first pass, ``x, s``, the old ``p``
#: and the new), ``r`` of two iterations and ``q``; SIRT ``x`` of two iterations and the
#: column weights, the row weights and ``w``.
METHODS: dict[str, Method] = {
    "fbp": Method(solve_fbp, fbp_stages),
    "gridrec": Method(solve_gridrec, gridrec_stages, fit=fitting_slabs, blocks=("slab",),
                      projector=False, parallel_only=True),
    "sirt": Method(_iterative(sirt, 2, lambda solving: {"nonnegative": solving.nonnegative}),
                   iterative_stages, vectors=(3, 2)),
    "cgls": Method(_iterative(cgls, 1), iterative_stages, vectors=(4, 3)),
}
#: The methods that iterate (a workdir, checkpoints, the vectors' state).
ITERATIVE: tuple[str, ...] = tuple(name for name, m in METHODS.items() if m.vectors)
