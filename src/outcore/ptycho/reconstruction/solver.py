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

The object's and the probe modes' steps are the batch's own (``steps``: LSQML's closed form)
unless ``step_object``/``step_probe``/``alpha`` are given (then rPIE's preconditioned
step with them). A run that stops on the loss (``iterations`` None) stops at the noise
floor (``NOISE_FACTOR`` times it, for counts) or when the loss has settled
(``Trajectory``); before that, a settled loss first changes what the data decide
(``adapt``): probe modes when one mode leaves more than noise, position refinement when the
positions' Gauss-Newton steps are beyond noise, a larger batch while the batch's noise limits
the step, so that it never stops "at tolerance" while the step is the limit.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
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
from outcore.ptycho.reconstruction.probe import centred, initial_modes, orthogonal_modes, support
from outcore.ptycho.reconstruction.steps import chosen_update

RESIDENCIES: tuple[str, ...] = ("device", "host", "disk")
#: Iterations over which the loss must fall by ``tolerance`` each (the median slope of its
#: logarithm, so one iteration's spike of a mini-batch's noise neither stops nor holds a
#: run), to go on.
STOP_WINDOW = 8
#: Nor does a run stop on the loss while an iteration still moves a position this far (px).
POSITIONS_SETTLED = 0.01
#: A loss within this many times the noise floor of counting data has converged (the stop,
#: and the warning beyond it).
NOISE_FACTOR = 1.0
#: For data that are not counts: a loss above this share of ``sum a^2`` leaves more than
#: noise (more probe modes may fit it; the warning beyond it).
RESIDUAL_LIMIT = 1e-2
#: Probe modes a run takes when one mode leaves more than noise.
AUTO_MODES = 3
#: A run far from the noise floor changes its model (probe modes, refinement) once the loss
#: falls too slowly to reach the floor within this many iterations.
ADAPT_HORIZON = 50
#: Within this many times the noise floor the object is good enough to tell whether the
#: positions are off (a trial of position refinement does not wait for a slow loss).
NEAR_FLOOR = 3.0
#: Positions are refined when their Gauss-Newton steps' mean square is this many times what
#: the noise makes and their RMS at least ``POSITION_LEAST`` pixels.
POSITION_SIGNIFICANCE, POSITION_LEAST = 4.0, 0.02


@dataclass(frozen=True)
class Settings:
    """How the reconstruction runs (all independent of the number of workers).

    ``iterations``: how many; None runs until the loss changes by less than ``tolerance``
    (relative) from one iteration to the next, at most ``max_iterations``.
    ``batch_size``: positions per update (global; None = all, one step per iteration).
    ``sub_batch``: positions a shard computes at once (bounds its scratch, not the result).
    ``step_object`` / ``step_probe``: step lengths of the preconditioned updates (1 = the
    ePIE/rPIE projection; None: the batch's own, ``steps``). ``probe_start``: first
    iteration (0-based) that updates the probe. ``alpha``: rPIE's regularisation of the
    preconditioner (None: ``steps.REGULARISATION``). ``seed``: the batch permutations.
    ``noise``: ``amplitude`` or ``poisson`` (``kernels``). ``probe_modes``: incoherent probe
    modes (the caller makes the starting modes). ``refine_positions`` from iteration
    ``refine_from`` on, steps of ``position_step`` times the Gauss-Newton step, each at most
    ``position_limit`` pixels per axis, never beyond ``position_bound`` pixels of the start;
    ``position_affine``: keep the corrections an affine map of the start;
    ``curvature_every``: iterations between new Gauss-Newton matrices (1: every iteration).
    ``slices`` and ``slice_thickness`` (m): multislice (the caller makes the propagator).
    ``probe_centring``: keep the probe's centre of intensity in the window's centre (rolling
    the object with it); ``probe_support``: keep the probe within that fraction of the
    half window (None: no support). ``adapt_modes``, ``adapt_positions``, ``adapt_batch``:
    what the data may change when the loss settles (``adapt``): ``AUTO_MODES`` probe
    modes, position refinement, a larger batch.
    """

    iterations: int | None = None
    batch_size: int | None = None
    residency: str = "host"
    sub_batch: int = 64
    step_object: float | None = None
    step_probe: float | None = None
    probe_start: int = 2
    alpha: float | None = None
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
    adapt_modes: bool = False
    adapt_positions: bool = False
    adapt_batch: bool = False

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
        if not ((self.step_object is None or self.step_object > 0)
                and (self.step_probe is None or self.step_probe >= 0)
                and (self.alpha is None or 0 <= self.alpha <= 1)):
            raise OutcoreError(
                f"Step lengths {self.step_object}/{self.step_probe} or alpha {self.alpha} are "
                "out of range.", "use a positive object step, a probe step >= 0 and alpha in "
                "[0, 1], or leave them out for the steps the data choose.")
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
    matrix ``curvature`` (n, 3) float64 (NaN rows: none yet). What an iteration measures on
    the side: ``steps``, the mean steps of its batches ``[object, probe modes...]``;
    ``positions``, the positions' Gauss-Newton steps ``[sum |step|^2, sum of their noise
    variance per unit noise, positions, positions held at their bound or the object's
    edge]``."""

    obj: Any
    probe: Any
    coords: np.ndarray
    loss: float = 0.0
    curvature: np.ndarray | None = None
    steps: np.ndarray | None = None
    positions: np.ndarray | None = None


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
    probe_on = iteration >= settings.probe_start
    taken = state.steps
    if settings.step_object is not None and settings.step_probe is not None:
        obj, probe = update(state.obj, state.probe, terms, state.coords[batch],
                            step_obj=settings.step_object,
                            step_probe=settings.step_probe if probe_on else 0.0,
                            alpha=0.02 if settings.alpha is None else settings.alpha)
    else:
        obj, probe, chosen = chosen_update(
            state.obj, state.probe, terms, state.coords[batch], step_obj=settings.step_object,
            step_probe=settings.step_probe, alpha=settings.alpha, probe_on=probe_on)
        now = np.concatenate([[chosen.object.sum()], chosen.probe, [1.0]])
        taken = now if first or taken is None or len(taken) != len(now) else taken + now
    coords, curvature, measured = state.coords, state.curvature, None
    if terms.index is not None:
        curvature = kept_curvature(curvature, terms, len(coords))
        newton = gauss_newton(terms.grad_pos, curvature[terms.index])
        move = np.clip(settings.position_step * newton, -settings.position_limit,
                       settings.position_limit)
        coords = coords.copy()
        moved = coords[terms.index] + move
        bound = settings.position_bound
        moved = np.clip(moved, start[terms.index] - bound, start[terms.index] + bound)
        coords[terms.index] = inside(moved, state)
        held = np.abs(coords[terms.index] - start[terms.index]) >= bound - WHOLE_TOLERANCE
        held |= coords[terms.index] != moved
        measured = _measured(state.positions if not first else None, newton,
                             curvature[terms.index], held.any(axis=1))
    return State(obj, probe, coords, terms.loss + (0.0 if first else state.loss), curvature,
                 taken, measured)


def _measured(before: np.ndarray | None, newton: np.ndarray, curvature: np.ndarray,
              held: np.ndarray) -> np.ndarray:
    """``State.positions`` with a batch's Gauss-Newton steps ``newton`` (b, 2) added: their
    squares, their variance per unit noise variance (``tr C^-1`` of each ``curvature``
    ``[yy, yx, xx]``, the inverse of the Gauss-Newton matrix of its amplitudes), their
    number and those ``held`` (at their bound or the object's edge)."""
    yy, yx, xx = curvature.T
    det = np.maximum(yy * xx - yx * yx, TINY)
    added = np.array([float((newton**2).sum()), float(((yy + xx) / det).sum()),
                      float(len(newton)), float(held.sum())])
    return added if before is None else before + added


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


@dataclass(frozen=True)
class Goal:
    """What the data let a run reach: the noise ``floor`` of counting data (the loss
    expected at the truth; None when the data are not counts), the data's ``power``
    ``sum a^2``, the variance of one amplitude's noise (``noise_var``: 1/4 for counts;
    None: the residual's), the scan's ``positions`` and the detector pixels of each pattern
    (``pixels``), and whether the object has room to refine the positions
    (``refinable``)."""

    floor: float | None
    power: float
    positions: int
    pixels: int
    noise_var: float | None = 0.25
    refinable: bool = True

    def excess(self, loss: float) -> float:
        """How far ``loss`` is from what noise leaves, as a multiple of the limit
        (``NOISE_FACTOR`` times the floor; without one, ``RESIDUAL_LIMIT`` of the power):
        above 1, more than noise is left."""
        if self.floor is not None:
            return loss / (NOISE_FACTOR * self.floor)
        return loss / (RESIDUAL_LIMIT * self.power) if self.power > 0 else 0.0

    def amplitude_var(self, loss: float) -> float:
        """The variance of one amplitude's noise: ``noise_var``, or the residual's per pixel."""
        if self.noise_var is not None and self.floor is not None:
            return self.noise_var
        return loss / max(self.positions * self.pixels, 1)


@dataclass
class Trajectory:
    """The losses of the iterations run (each the sum over its batches of the loss before
    each update), the largest move of a position in each, the mean steps of each
    (``steps``: object, then each probe mode), what the data changed on the way
    (``events``: dicts of ``iteration``, ``name``, ``value``, ``why``), the settings the
    run ended with (``settings``) and why the run
    stopped: ``iterations``, ``noise floor`` (the loss within ``NOISE_FACTOR`` of it),
    ``settled`` (the loss fell by less than ``tolerance`` per iteration over the last
    ``STOP_WINDOW``, no position moved ``POSITIONS_SETTLED`` and nothing was left to
    adapt), ``max_iterations`` or ``diverged`` (a loss that is not finite)."""

    losses: list[float] = field(default_factory=list)
    stopped: str = ""
    moves: list[float] = field(default_factory=list)
    steps: list[list[float]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    settings: Settings | None = None
    positions: list[list[float] | None] = field(default_factory=list)

    def record(self, loss: float, before: np.ndarray, after: np.ndarray,
               steps: np.ndarray | None = None, positions: np.ndarray | None = None) -> None:
        """One more iteration: its loss, how far (pixels) it moved the positions at most
        (``before`` and ``after`` it), its summed steps (``State.steps``) and its
        positions' Gauss-Newton steps (``State.positions``, when it refined them)."""
        self.losses.append(loss)
        self.moves.append(float(np.abs(after - before).max()) if len(after) else 0.0)
        if steps is not None:
            self.steps.append([round(float(v), 6) for v in steps[:-1] / max(steps[-1], 1)])
        self.positions.append(None if positions is None else [float(v) for v in positions])

    def positions_settled(self, goal: Goal | None) -> bool:
        """Whether the last iteration left the positions where they are: no refinement, its
        positions' Gauss-Newton steps within ``POSITION_SIGNIFICANCE`` times their noise
        (``goal``'s), or, without a goal, no move of ``POSITIONS_SETTLED`` pixels."""
        measured = self.positions[-1] if self.positions else None
        if goal is None or measured is None:
            return not self.moves or self.moves[-1] < POSITIONS_SETTLED
        squares, spread = measured[0], measured[1]
        return squares < POSITION_SIGNIFICANCE * goal.amplitude_var(self.losses[-1]) * spread

    def change(self, window: int = STOP_WINDOW) -> float:
        """The relative fall of the loss per iteration over the last ``window`` iterations:
        minus the median slope of its logarithm over every pair of them (Theil-Sen)."""
        recent = np.log(np.maximum(np.asarray(self.losses[-window:], np.float64), TINY))
        first, second = np.triu_indices(len(recent), 1)
        if not len(first):
            return 0.0
        return float(-np.median((recent[second] - recent[first]) / (second - first)))

    def since_change(self) -> int:
        """Iterations since the last change of what runs (an event), or since the start."""
        last = max((event["iteration"] for event in self.events), default=-1)
        return len(self.losses) - 1 - last

    def settled(self, settings: Settings, goal: Goal | None = None) -> bool:
        """Whether the loss has stopped falling (by ``tolerance`` per iteration over
        ``STOP_WINDOW`` since the last change) with no position still moving
        (``positions_settled``)."""
        return (self.since_change() >= STOP_WINDOW and self.change() < settings.tolerance
                and self.positions_settled(goal))

    def done(self, settings: Settings, goal: Goal | None = None) -> bool:
        """Whether to stop after the iterations so far (and say why in ``stopped``)."""
        if self.stopped:
            return True
        if self.losses and not math.isfinite(self.losses[-1]):
            self.stopped = "diverged"
        elif settings.iterations is not None:
            if len(self.losses) >= settings.iterations:
                self.stopped = "iterations"
        elif len(self.losses) >= settings.max_iterations:
            self.stopped = "max_iterations"
        elif (goal is not None and self.at_floor(goal) and not self.trial_pending()
              and self.positions_settled(goal)):
            self.stopped = "noise floor"
        elif goal is None and self.settled(settings):
            self.stopped = "settled"  # nothing to adapt without a goal
        return bool(self.stopped)

    def at_floor(self, goal: Goal) -> bool:
        """Whether the last loss is within ``NOISE_FACTOR`` of the noise floor."""
        return goal.floor is not None and bool(self.losses) and goal.excess(self.losses[-1]) <= 1

    def trial_pending(self) -> bool:
        """Whether a trial of position refinement starts after the last iteration."""
        trials = [e["iteration"] for e in self.events if e["name"] == "position_trial"]
        return bool(trials) and trials[-1] == len(self.losses) - 1

    def event(self, iteration: int, name: str, value: Any, why: str) -> None:
        self.events.append({"iteration": iteration, "name": name, "value": value, "why": why})

    def checked_positions(self) -> bool:
        return any(event["name"] == "refine_positions" for event in self.events)


def adapt(trajectory: Trajectory, settings: Settings, state: State, goal: Goal,
          start: np.ndarray, iteration: int) -> tuple[Settings, State]:
    """After ``iteration``: what the data change when the loss has settled, reached the
    noise floor or falls too slowly to reach it (``ADAPT_HORIZON``), or a trial of position
    refinement ends, in order: ``AUTO_MODES`` probe modes when one mode leaves
    more than noise (``Goal.excess``), position refinement tried for one iteration and kept
    when the positions' Gauss-Newton steps are beyond noise (``POSITION_SIGNIFICANCE``;
    only when ``goal.refinable``: the object has room for it; tried too once the loss is
    within ``NEAR_FLOOR`` of the floor), then, once settled, twice the batch while it is
    not the whole scan; else the run has settled (``trajectory.stopped``, unless it runs a
    fixed number of ``iterations``). Each change is an
    event of ``trajectory``; the settings and state to go on with."""
    if trajectory.stopped or not trajectory.losses or not math.isfinite(trajectory.losses[-1]):
        return settings, state
    trial = [e for e in trajectory.events if e["name"] == "position_trial"]
    if trial and trial[-1]["iteration"] == iteration - 1 and not trajectory.checked_positions():
        return _judged_positions(trajectory, settings, state, goal, start, iteration)
    floor = trajectory.at_floor(goal)
    loss = trajectory.losses[-1]
    slow = (trajectory.since_change() >= STOP_WINDOW and goal.excess(loss) > 1
            and trajectory.change() < math.log(goal.excess(loss)) / ADAPT_HORIZON)
    settled = trajectory.settled(settings, goal)
    near = trajectory.since_change() >= STOP_WINDOW and goal.excess(loss) < NEAR_FLOOR
    if not (settled or floor or slow or near):
        return settings, state
    if (settings.adapt_modes and settings.probe_modes < AUTO_MODES and goal.excess(loss) > 1
            and (slow or settled)):
        trajectory.event(iteration, "probe_modes", AUTO_MODES, _excess_words(goal, loss) +
                         f": one probe mode leaves more than noise, so {AUTO_MODES} modes "
                         "(partial coherence); probe_modes= sets them")
        probe = initial_modes(to_host(state.probe), AUTO_MODES)
        xp = array_namespace(state.probe)
        return (replace(settings, probe_modes=AUTO_MODES),
                replace(state, probe=xp.asarray(probe), steps=None))
    if (settings.adapt_positions and not settings.refine_positions and goal.refinable
            and not trajectory.checked_positions()):
        trajectory.event(iteration, "position_trial", True,
                         ("the loss reached the noise floor" if floor else
                          "the loss came near the noise floor" if near else
                          "the loss fell too slowly")
                         + ": one iteration of position refinement measures how far the "
                         "positions are off")
        return (replace(settings, refine_positions=True, refine_from=iteration + 1),
                replace(state, positions=None))
    if floor or not settled:
        return settings, state
    if settings.adapt_batch and settings.batch_size is not None \
            and settings.batch_size < len(start):
        size = min(len(start), 2 * settings.batch_size)
        trajectory.event(iteration, "batch_size", size, "the loss settled at the steps of "
                         f"batches of {settings.batch_size}: their noise limits the step, so "
                         f"batches of {size}")
        return replace(settings, batch_size=size), state
    if settings.iterations is None:
        trajectory.stopped = "settled"
    return settings, state


def _excess_words(goal: Goal, loss: float) -> str:
    if goal.floor is not None:
        return (f"the loss fell too slowly to reach the noise floor at {loss / goal.floor:.1f}"
                " times it")
    return f"the loss fell too slowly at {loss / goal.power:.2%} of the data's power"


def _judged_positions(trajectory: Trajectory, settings: Settings, state: State, goal: Goal,
                      start: np.ndarray, iteration: int) -> tuple[Settings, State]:
    """The end of a trial of position refinement: kept when the positions' Gauss-Newton
    steps (``State.positions``) are ``POSITION_SIGNIFICANCE`` times their noise or more
    (and ``POSITION_LEAST`` pixels RMS), else the positions back where they started."""
    squares, spread, count, held = state.positions if state.positions is not None \
        else (0.0, 1.0, 1.0, 0.0)
    noise = goal.amplitude_var(trajectory.losses[-1]) * spread
    ratio = squares / max(noise, TINY)
    rms = math.sqrt(squares / max(count, 1))
    keep = bool(ratio >= POSITION_SIGNIFICANCE and rms >= POSITION_LEAST)
    words = (f"the positions' Gauss-Newton steps are {rms:.3g} px RMS, {ratio:.1f} times what "
             "noise makes")
    trajectory.event(iteration, "refine_positions", keep,
                     words + ("; refine_positions= sets it" if keep else
                              ": they are not off; refine_positions= sets it"))
    if held:
        trajectory.event(iteration, "positions_held", int(held),
                         f"{int(held)} position steps stopped at position_bound= or the "
                         "object's edge")
    if keep:
        return settings, state
    return (replace(settings, refine_positions=False),
            replace(state, coords=np.array(start, np.float64), curvature=None))


def serial(amplitudes: Callable[[np.ndarray], Any], state: State, settings: Settings,
           model: Model, start_iteration: int = 0, trajectory: Trajectory | None = None,
           on_iteration: Callable[[int, float, State], None] | None = None,
           goal: Goal | None = None) -> tuple[State, Trajectory]:
    """The reconstruction as a plain loop in this process, the same batches, sub-batches,
    sums, updates and adaptations (``adapt``, with ``goal``; None: none) as the engine:
    ``amplitudes(positions)`` gives the (b, K, K) targets of the sorted global
    ``positions``."""
    start = np.asarray(state.coords, np.float64).copy()
    trajectory = trajectory or Trajectory()
    trajectory.settings = settings
    iteration = start_iteration
    while not trajectory.done(settings, goal):
        before = state.coords
        for number, batch in enumerate(batches(len(start), settings.batch_size, settings.seed,
                                               iteration)):
            pieces = sub_batches(batch, settings.sub_batch)
            terms = summed_terms(state, pieces, map(amplitudes, pieces), model, settings,
                                 iteration, new_curvature(state, batch, settings, iteration))
            state = step(state, terms, batch, settings, iteration, number == 0, start)
        state = end_iteration(state, settings, iteration, start)
        trajectory.record(state.loss, before, state.coords, state.steps, state.positions)
        if on_iteration is not None:
            on_iteration(iteration, state.loss, state)
        if goal is not None:
            settings, state = adapt(trajectory, settings, state, goal, start, iteration)
            trajectory.settings = settings
        iteration += 1
    return state, trajectory


def on_host(state: State) -> State:
    """The state with numpy arrays (what the client keeps between iterations)."""
    return replace(state, obj=to_host(state.obj), probe=to_host(state.probe))
