"""What one reconstruction step and one iteration do to the state, independent of where it
runs: the settings, the state, the update of a batch (object, probe modes, positions) and the
constraints applied between iterations. ``outcore.ptycho.reconstruction.engine`` runs these on
a Dask cluster; ``serial`` runs them in a plain loop in this process (the engine's numpy twin and
the benchmark's floor).

Positions are ``coords`` (n, 2) float64, the ``(row, col)`` of each window's corner in
object pixels (``kernels``); position refinement moves them by Gauss-Newton steps of each
position's own term, at most ``position_limit`` pixels a step and ``position_bound``
pixels from where they started, and then removes their mean correction (a shift of every
position is a shift of the object, which the data cannot see) or, with
``position_affine``, replaces the corrections by their best affine map of the start. A
position's Gauss-Newton matrix (half the cost of a refined term) is computed on the first
refined iteration and then every ``curvature_every`` iterations; in between its step uses
the latest one, held in the state (and so in checkpoints).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from outcore.backend import WHOLE_TOLERANCE, array_namespace, nearest_whole, to_host
from outcore.checks import at_least, choice
from outcore.errors import OutcoreError
from outcore.ptycho.reconstruction.model import (
    NOISE_MODELS,
    TINY,
    BatchTerms,
    Model,
    batch_terms,
    update,
)
from outcore.ptycho.reconstruction.probe import centred, orthogonal_modes, support

RESIDENCIES: tuple[str, ...] = ("device", "host", "disk")
#: Iterations over which the loss must fall by ``tolerance`` each, on average, to go on.
STOP_WINDOW = 5
#: Nor does a run stop on the loss while an iteration still moves a position this far (px).
POSITIONS_SETTLED = 0.01


@dataclass(frozen=True)
class Settings:
    """How the reconstruction runs (all independent of the number of workers).

    ``iterations``: how many; None runs until the loss changes by less than ``tolerance``
    (relative) from one iteration to the next, at most ``max_iterations``.
    ``batch_size``: positions per update (global; None = all, one step per iteration).
    ``sub_batch``: positions a shard computes at once (bounds its scratch, not the result).
    ``step_object`` / ``step_probe``: step lengths of the preconditioned updates (1 = the
    ePIE/rPIE projection). ``probe_start``: first iteration (0-based) that updates the probe.
    ``alpha``: rPIE's regularisation of the preconditioner. ``seed``: the batch permutations.
    ``noise``: ``amplitude`` or ``poisson`` (``kernels``). ``probe_modes``: incoherent probe
    modes (the caller makes the starting modes). ``refine_positions`` from iteration
    ``refine_from`` on, steps of ``position_step`` times the Gauss-Newton step, each at most
    ``position_limit`` pixels per axis, never beyond ``position_bound`` pixels of the start;
    ``position_affine``: keep the corrections an affine map of the start;
    ``curvature_every``: iterations between new Gauss-Newton matrices (1: every iteration).
    ``slices`` and ``slice_thickness`` (m): multislice (the caller makes the propagator).
    ``probe_centring``: keep the probe's centre of intensity in the window's centre (rolling
    the object with it); ``probe_support``: keep the probe within that fraction of the
    half window (None: no support).
    """

    iterations: int | None = None
    batch_size: int | None = None
    residency: str = "host"
    sub_batch: int = 64
    step_object: float = 1.0
    step_probe: float = 1.0
    probe_start: int = 2
    alpha: float = 0.02
    seed: int = 0
    tolerance: float = 1e-3
    max_iterations: int = 300
    noise: str = "amplitude"
    probe_modes: int = 1
    refine_positions: bool = False
    refine_from: int = 5
    position_step: float = 1.0
    position_limit: float = 0.25
    position_bound: float = 3.0
    position_affine: bool = False
    curvature_every: int = 4
    slices: int = 1
    slice_thickness: float | None = None
    probe_centring: bool = True
    probe_support: float | None = None

    def validate(self, n_positions: int) -> None:
        """Refuse settings that cannot run, before any compute (messages name the keywords
        of ``outcore.ptycho.reconstruct``)."""
        choice(self.residency, RESIDENCIES, "residency")
        choice(self.noise, NOISE_MODELS, "noise")
        at_least(self.iterations, "iterations", what="a positive iterations=, or leave it"
                 " out to stop on the loss")
        at_least(self.max_iterations, "max_iterations")
        at_least(self.sub_batch, "sub_batch", what="a positive sub_batch=")
        at_least(self.probe_modes, "probe_modes", what="1 or more probe modes")
        at_least(self.slices, "slices", what="1 or more slices")
        at_least(self.refine_from, "refine_from", 0)
        at_least(self.curvature_every, "curvature_every")
        at_least(self.probe_start, "probe_start", 0)
        if self.batch_size is not None and not 1 <= self.batch_size <= n_positions:
            raise OutcoreError(
                f"batch_size={self.batch_size} is not between 1 and the {n_positions} "
                "positions.",
                "give a batch size up to the number of positions, or omit it for full batches.")
        if not (self.step_object > 0 and self.step_probe >= 0 and 0 <= self.alpha <= 1):
            raise OutcoreError(
                f"Step lengths {self.step_object}/{self.step_probe} or alpha {self.alpha} are "
                "out of range.", "use a positive object step, a probe step >= 0 and alpha in "
                "[0, 1].")
        if not self.tolerance > 0:
            raise OutcoreError(f"tolerance={self.tolerance} must be positive.",
                               "give a relative loss change, e.g. tolerance=1e-3.")
        if not (self.position_step > 0 and self.position_limit > 0 and self.position_bound > 0):
            raise OutcoreError(
                f"Position step {self.position_step}, limit {self.position_limit} or bound "
                f"{self.position_bound} is not positive.",
                "give positive position_step=, position_limit= and position_bound=.")
        if self.probe_support is not None and not 0 < self.probe_support <= 1.5:
            raise OutcoreError(f"probe_support={self.probe_support} is not a fraction of "
                               "the half window in (0, 1.5].", "give e.g. probe_support=0.9, "
                               "or leave it out.")
        if self.slices == 1 and self.slice_thickness is not None:
            raise OutcoreError(f"slice_thickness={self.slice_thickness} was given without "
                               "slices=.", "add slices=2 (or more), or drop "
                               "slice_thickness=.")
        if self.slices > 1 and not (self.slice_thickness is not None
                                    and math.isfinite(self.slice_thickness)
                                    and self.slice_thickness > 0):
            raise OutcoreError(f"slices={self.slices} needs a positive slice_thickness= "
                               f"(got {self.slice_thickness}).",
                               "give the distance between slices in metres, e.g. "
                               "slice_thickness=2e-9.")

    @property
    def stops_on_loss(self) -> bool:
        return self.iterations is None

    @property
    def last_iteration(self) -> int:
        """The number of iterations at most."""
        return self.max_iterations if self.iterations is None else self.iterations


@dataclass
class State:
    """Object (S, Ny, Nx) and probe (M, K, K), complex64, the positions ``coords`` (n, 2)
    float64 (window corners, pixels), the loss summed over the steps of the current
    iteration so far and, once positions are refined, each position's latest Gauss-Newton
    matrix ``curvature`` (n, 3) float64 (NaN rows: none yet)."""

    obj: Any
    probe: Any
    coords: np.ndarray
    loss: float = 0.0
    curvature: np.ndarray | None = None


def batches(n_positions: int, batch_size: int | None, seed: int, iteration: int
            ) -> list[np.ndarray]:
    """The global batches of one iteration: a permutation of ``range(n_positions)`` drawn from
    ``(seed, iteration)``, cut into ``batch_size`` pieces, each sorted (int64 arrays)."""
    if batch_size is None or batch_size >= n_positions:
        return [np.arange(n_positions)]
    order = np.random.default_rng([seed, iteration]).permutation(n_positions)
    return [np.sort(order[i:i + batch_size]) for i in range(0, n_positions, batch_size)]


def sub_batches(positions: np.ndarray, size: int) -> list[np.ndarray]:
    """``positions`` cut into pieces of ``size`` (the last one shorter)."""
    return [positions[i:i + size] for i in range(0, len(positions), size)]


def refines(settings: Settings, iteration: int) -> bool:
    """Whether this iteration refines the positions."""
    return settings.refine_positions and iteration >= settings.refine_from


def new_curvature(state: State, batch: np.ndarray, settings: Settings, iteration: int
                  ) -> bool:
    """Whether the refined positions of ``batch`` get new Gauss-Newton matrices: every
    ``curvature_every`` iterations from ``refine_from``, and where the state holds none for
    them (a new or resumed refinement; within an iteration a batch's positions all have one
    or none, so the answer is the same for any of its parts)."""
    if (iteration - settings.refine_from) % settings.curvature_every == 0:
        return True
    return state.curvature is None or bool(np.isnan(state.curvature[batch]).any())


def terms_of(state: State, amplitudes: Any, positions: np.ndarray, model: Model,
             settings: Settings, iteration: int, curvature: bool) -> BatchTerms:
    """The terms of the global ``positions`` whose amplitudes are ``amplitudes``; refined,
    with new Gauss-Newton matrices when ``curvature`` (``new_curvature`` of their batch)."""
    if not refines(settings, iteration):
        return batch_terms(state.obj, state.probe, state.coords[positions], amplitudes, model)
    return batch_terms(state.obj, state.probe, state.coords[positions], amplitudes, model,
                       index=positions, curvature=curvature)


def summed_terms(state: State, pieces: Sequence[np.ndarray], frames: Iterable[Any],
                 model: Model, settings: Settings, iteration: int, curvature: bool
                 ) -> BatchTerms:
    """The terms of the positions ``pieces`` (sub-batches of sorted global positions, one
    ``frames`` entry each), added in order into one region that holds all their windows;
    ``curvature`` as in ``terms_of``."""
    k = state.probe.shape[-1]
    corners = nearest_whole(state.coords[np.concatenate(pieces)])
    origin = tuple(int(v) for v in corners.min(axis=0))
    extent = tuple(int(v) for v in corners.max(axis=0) - np.asarray(origin) + k)
    total: BatchTerms | None = None
    for piece, amplitudes in zip(pieces, frames, strict=True):
        part = terms_of(state, amplitudes, piece, model, settings, iteration, curvature)
        if total is None:
            total = BatchTerms.zeros(origin, extent, part)  # type: ignore[arg-type]
        total = total.accumulate(part)
    assert total is not None
    return total


def step(state: State, terms: BatchTerms, batch: np.ndarray, settings: Settings,
         iteration: int, first: bool, start: np.ndarray) -> State:
    """The state after one batch: object and probe updated from ``terms`` (the batch's),
    positions moved when refined (never beyond ``position_bound`` of ``start``, nor their
    windows out of the object), the batch's loss added to the iteration's (or starting it,
    when ``first``)."""
    step_probe = settings.step_probe if iteration >= settings.probe_start else 0.0
    obj, probe = update(state.obj, state.probe, terms, state.coords[batch],
                        step_obj=settings.step_object, step_probe=step_probe,
                        alpha=settings.alpha)
    coords, curvature = state.coords, state.curvature
    if terms.index is not None:
        curvature = kept_curvature(curvature, terms, len(coords))
        move = settings.position_step * gauss_newton(terms.grad_pos, curvature[terms.index])
        move = np.clip(move, -settings.position_limit, settings.position_limit)
        coords = coords.copy()
        moved = coords[terms.index] + move
        bound = settings.position_bound
        moved = np.clip(moved, start[terms.index] - bound, start[terms.index] + bound)
        coords[terms.index] = inside(moved, state)
    return State(obj, probe, coords, terms.loss + (0.0 if first else state.loss), curvature)


def kept_curvature(curvature: np.ndarray | None, terms: BatchTerms, n_positions: int
                   ) -> np.ndarray:
    """The positions' Gauss-Newton matrices (n, 3) with the new ones of ``terms`` put in
    (a new array when there are new ones; rows that ``terms`` did not compute keep their
    values)."""
    new = ~np.isnan(terms.curv_pos).any(axis=1)
    if curvature is not None and not new.any():  # a batch that reuses its matrices
        return curvature
    kept = np.full((n_positions, 3), np.nan) if curvature is None else curvature.copy()
    kept[terms.index[new]] = terms.curv_pos[new]
    return kept


def gauss_newton(grad: np.ndarray, curvature: np.ndarray) -> np.ndarray:
    """The Gauss-Newton steps ``-H^-1 grad / 2`` (b, 2) of least-squares positions, ``H`` from
    ``curvature`` (b, 3) ``[yy, yx, xx]``, damped by 1e-3 of its trace."""
    yy, yx, xx = curvature.T
    damp = 1e-3 * (yy + xx) + TINY
    yy, xx = yy + damp, xx + damp
    det = yy * xx - yx * yx
    gy, gx = grad.T
    return -0.5 * np.stack([(xx * gy - yx * gx) / det, (yy * gx - yx * gy) / det], axis=1)


def end_iteration(state: State, settings: Settings, iteration: int, start: np.ndarray
                  ) -> State:
    """The constraints between iterations: the probe modes orthogonalised (ordered by
    power), within ``probe_support`` and centred (``probe_centring``, object along), and
    refined positions' corrections without their mean (or, with ``position_affine``, their
    affine fit)."""
    obj, probe = state.obj, state.probe
    if probe.shape[0] > 1:
        probe = orthogonal_modes(probe)
    if settings.probe_support is not None:
        probe = probe * support(probe.shape[-1], settings.probe_support,
                                array_namespace(probe)).astype(probe.real.dtype)
    if settings.probe_centring and iteration >= settings.probe_start:
        obj, probe = centred(obj, probe)
    coords = state.coords
    if refines(settings, iteration):
        correction = coords - start
        if settings.position_affine:
            design = np.column_stack([start, np.ones(len(start))])
            correction = design @ np.linalg.lstsq(design, correction, rcond=None)[0]
        coords = inside(start + correction - correction.mean(axis=0), state)
    return replace(state, obj=obj, probe=probe, coords=coords)


def inside(coords: np.ndarray, state: State) -> np.ndarray:
    """``coords`` clipped so that every window lies in the object (its corner rounds to
    0 .. N - K on each axis, ``nearest_whole``'s halves up)."""
    last = np.asarray(state.obj.shape[-2:]) - state.probe.shape[-1] + 0.5 - 2 * WHOLE_TOLERANCE
    return np.clip(coords, -0.5, last)


@dataclass
class Trajectory:
    """The losses of the iterations run (each the sum over its batches of the loss before
    each update), the largest move of a position in each, and why the run stopped:
    ``iterations``, ``tolerance`` (the loss fell by less than it per iteration over the last
    ``STOP_WINDOW`` and no position moved ``POSITIONS_SETTLED``), ``max_iterations`` or
    ``diverged`` (a loss that is not finite)."""

    losses: list[float] = field(default_factory=list)
    stopped: str = ""
    moves: list[float] = field(default_factory=list)

    def record(self, loss: float, before: np.ndarray, after: np.ndarray) -> None:
        """One more iteration: its loss and how far (pixels) it moved the positions at most
        (``before`` and ``after`` it)."""
        self.losses.append(loss)
        self.moves.append(float(np.abs(after - before).max()) if len(after) else 0.0)

    def change(self, window: int = STOP_WINDOW) -> float:
        """The relative fall of the loss per iteration over the last ``window`` iterations."""
        before, now = self.losses[-1 - window], self.losses[-1]
        return (before - now) / before / window if before > 0 else 0.0

    def done(self, settings: Settings) -> bool:
        """Whether to stop after the iterations so far (and say why in ``stopped``)."""
        if self.losses and not math.isfinite(self.losses[-1]):
            self.stopped = "diverged"
        elif settings.iterations is not None:
            if len(self.losses) >= settings.iterations:
                self.stopped = "iterations"
            return bool(self.stopped)
        if len(self.losses) >= settings.max_iterations:
            self.stopped = "max_iterations"
        elif len(self.losses) > STOP_WINDOW and self.change() < settings.tolerance and (
                not self.moves or self.moves[-1] < POSITIONS_SETTLED):
            self.stopped = "tolerance"
        return bool(self.stopped)


def serial(amplitudes: Callable[[np.ndarray], Any], state: State, settings: Settings,
           model: Model, start_iteration: int = 0, trajectory: Trajectory | None = None,
           on_iteration: Callable[[int, float, State], None] | None = None,
           ) -> tuple[State, Trajectory]:
    """The reconstruction as a plain loop in this process, the same batches, sub-batches,
    sums and updates as the engine: ``amplitudes(positions)`` gives the (b, K, K) targets
    of the sorted global ``positions``."""
    start = np.asarray(state.coords, np.float64).copy()
    trajectory = trajectory or Trajectory()
    for iteration in _iterations(settings, start_iteration, trajectory):
        before = state.coords
        for number, batch in enumerate(batches(len(start), settings.batch_size, settings.seed,
                                               iteration)):
            pieces = sub_batches(batch, settings.sub_batch)
            terms = summed_terms(state, pieces, map(amplitudes, pieces), model, settings,
                                 iteration, new_curvature(state, batch, settings, iteration))
            state = step(state, terms, batch, settings, iteration, number == 0, start)
        state = end_iteration(state, settings, iteration, start)
        trajectory.record(state.loss, before, state.coords)
        if on_iteration is not None:
            on_iteration(iteration, state.loss, state)
    return state, trajectory


def _iterations(settings: Settings, first: int, trajectory: Trajectory) -> Iterator[int]:
    iteration = first
    while not trajectory.done(settings):
        yield iteration
        iteration += 1


def on_host(state: State) -> State:
    """The state with numpy arrays (what the client keeps between iterations)."""
    return replace(state, obj=to_host(state.obj), probe=to_host(state.probe))
