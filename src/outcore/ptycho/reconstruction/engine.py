"""Data-parallel mini-batch reconstruction on a Dask cluster: shards, steps, iterations.

The positions are split into contiguous *shards*, one per worker, each held by a Dask actor
(``ShardActor``) on its worker for the whole run: its targets (``residency``: ``device``
keeps the shard's amplitudes on the worker's device, ``host`` in its host memory and copies
each sub-batch to the device, ``disk`` reads each sub-batch from the zarr store
(``frames``), the next one in a thread while the current one computes) and its own copy of
the state (object, probe modes, positions).

Every iteration walks a seeded permutation of all positions in global batches of
``batch_size`` (``solver.batches``). One step is one call of each actor with the current
state: it returns the loss and gradients of its part of this batch (``solver.terms_of``,
host arrays); the client adds the parts in shard order (float64), applies the update
(``solver.step``) to its copy of the state and sends that with the next call. So a step
costs one round trip between the client and the actors, with no task through the scheduler,
and what travels is the parts (complex128, on the batch's region) and the state (complex64),
the smallest form of the update. With one shard the actor runs whole iterations by itself,
the update on its own device. The batches, the order of the sums and their float64
accumulation do not depend on the number of workers, so 1, 2 or N workers follow the same
loss trajectory to rounding (bitwise for the same shards on the numpy backend).

After each iteration the constraints between iterations (``solver.end_iteration``) are
applied to the client's copy (or by the single actor, which returns its state). When a
worker dies, the iteration is replayed from that copy on actors made anew for the same
shards on the workers that remain, which gives the same result as a clean run.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import distributed
import numpy as np

from outcore.backend import namespace, to_host
from outcore.errors import OutcoreError
from outcore.ptycho import kernels
from outcore.ptycho.reconstruction import solver
from outcore.ptycho.reconstruction.frames import reader
from outcore.ptycho.reconstruction.model import (
    AMPLITUDE,
    BatchTerms,
    Model,
    as_modes,
    as_slices,
    warm,
)
from outcore.ptycho.reconstruction.solver import RESIDENCIES, Settings, State, Trajectory, batches

__all__ = ["RESIDENCIES", "Result", "Settings", "State", "batches", "run", "shard_bounds"]

#: Times one iteration is replayed after a worker failure before the run gives up.
ITERATION_RETRIES = 3
#: What a call of an actor raises when its worker is gone.
LOST = (OSError, RuntimeError, distributed.client.FutureCancelledError,
        distributed.scheduler.KilledWorker)


def shard_bounds(n_positions: int, shards: int, chunk: int = 1) -> list[tuple[int, int]]:
    """Contiguous ``[start, stop)`` ranges of positions, one per shard, cut at multiples of
    ``chunk`` (the store's chunk along ``position``) so no shard reads a chunk twice."""
    chunks = math.ceil(n_positions / chunk)
    shards = max(1, min(shards, chunks))
    edges = [min(round(i * chunks / shards) * chunk, n_positions) for i in range(shards + 1)]
    return [(a, b) for a, b in zip(edges[:-1], edges[1:], strict=True) if b > a]


class ShardActor:
    """The positions ``[start, stop)`` on one worker: their targets (n, K, K) float32 (unless
    ``disk``) and a copy of the state, stepped with the summed terms of every batch."""

    def __init__(self, store: str, variable: str, start: int, stop: int, residency: str,
                 backend: str, model: Model, settings: Settings, origin: np.ndarray) -> None:
        self.store, self.variable = store, variable
        self.start, self.stop = start, stop
        self.residency, self.backend = residency, backend
        self.xp = namespace(backend)
        self.model = model.on(self.xp)
        self.settings = settings
        self.origin = np.asarray(origin, np.float64)  # every position's starting coords
        self.amplitudes: Any = None
        if residency != "disk":
            import zarr

            host = np.asarray(zarr.open_array(Path(store) / variable, mode="r")[start:stop],
                              dtype=np.float32)
            self.amplitudes = self.xp.asarray(host) if residency == "device" else \
                kernels.staged(host, backend)
        self.state: State | None = None

    def begin(self, state: State) -> None:
        """Take the state (host arrays) to go on from."""
        self.state = replace(state, obj=self.xp.asarray(state.obj),
                             probe=self.xp.asarray(state.probe),
                             coords=np.array(state.coords, np.float64))

    def advance(self, state: State, batch: np.ndarray, iteration: int, curvature: bool
                ) -> BatchTerms | None:
        """From ``state`` (host arrays), the terms of this shard's part of ``batch`` (None
        when it holds none of it), on the host; ``curvature``: ``solver.new_curvature`` of
        the batch (the client's state holds the matrices, this one not)."""
        self.begin(state)
        mine = batch[(batch >= self.start) & (batch < self.stop)]
        if not len(mine):
            return None
        return _moved(self._terms(mine, iteration, curvature), to_host)

    def iterate(self, iteration: int) -> State:
        """A whole iteration by this shard alone (it holds every position)."""
        for number, batch in enumerate(batches(len(self.origin), self.settings.batch_size,
                                               self.settings.seed, iteration)):
            fresh = solver.new_curvature(self.state, batch, self.settings, iteration)
            self.state = solver.step(self.state, self._terms(batch, iteration, fresh), batch,
                                     self.settings, iteration, number == 0, self.origin)
        self.state = solver.end_iteration(self.state, self.settings, iteration, self.origin)
        return solver.on_host(self.state)

    def _terms(self, positions: np.ndarray, iteration: int, curvature: bool) -> BatchTerms:
        """The terms of ``positions`` (sorted, global, all in this shard), summed over
        sub-batches in order; the next sub-batch is read while one computes."""
        pieces = solver.sub_batches(positions, self.settings.sub_batch)
        return solver.summed_terms(self.state, pieces, self._prefetched(pieces), self.model,
                                   self.settings, iteration, curvature)

    def _frames(self, positions: np.ndarray) -> Any:
        """Amplitudes of the (global, sorted) ``positions``, on the backend."""
        local = positions - self.start
        if self.residency == "device":
            return self.amplitudes[self.xp.asarray(local)]
        if self.residency == "host":
            return self.xp.asarray(self.amplitudes[local])
        return self.xp.asarray(reader(str(Path(self.store) / self.variable)).read(positions))

    def _prefetched(self, pieces: Sequence[np.ndarray]) -> Iterator[Any]:
        """The frames of each piece in turn, reading the next while the caller computes."""
        if self.residency == "device" or len(pieces) == 1:
            yield from (self._frames(p) for p in pieces)
            return
        with ThreadPoolExecutor(1, thread_name_prefix="outcore-prefetch") as pool:
            pending = pool.submit(self._frames, pieces[0])
            for nxt in [*pieces[1:], None]:
                frames = pending.result()
                if nxt is not None:
                    pending = pool.submit(self._frames, nxt)
                yield frames


def _moved(terms: BatchTerms, move: Callable[[Any], Any]) -> BatchTerms:
    """The terms with their arrays moved by ``move`` (to the host, or to a device)."""
    return replace(terms, grad_obj=move(terms.grad_obj), grad_probe=move(terms.grad_probe),
                   illum_probe=move(terms.illum_probe),
                   illum_slices=None if terms.illum_slices is None else move(
                       terms.illum_slices))


def _sum(parts: Sequence[BatchTerms | None]) -> BatchTerms:
    """The parts (in shard order) added, skipping shards without positions in the batch."""
    present = [p for p in parts if p is not None]
    total = present[0]
    for part in present[1:]:
        total = total + part
    return total


@dataclass
class Result:
    """Object and probe (the shapes given: (Ny, Nx) or (S, Ny, Nx); (K, K) or (M, K, K))
    complex64 numpy arrays, the positions ``coords`` (n, 2) float64 (refined or as given),
    the loss of every iteration (float64, the sum over its batches of the loss before each
    update) and why the run stopped (``solver.Trajectory``)."""

    obj: np.ndarray
    probe: np.ndarray
    coords: np.ndarray
    loss: np.ndarray
    stopped: str = ""


#: Called after each iteration with (iteration, loss, state on the host, in the shapes given).
IterationCallback = Callable[[int, float, State], None]


def run(client: distributed.Client, store: str | Path, coords: np.ndarray, obj: np.ndarray,
        probe: np.ndarray, settings: Settings, *, model: Model = AMPLITUDE,
        variable: str = "amplitudes", backend: str = "numpy", start_iteration: int = 0,
        losses: Sequence[float] = (), chunk: int = 1, start_coords: np.ndarray | None = None,
        curvature: np.ndarray | None = None, on_iteration: IterationCallback | None = None
        ) -> Result:
    """Reconstruct from the amplitudes ``variable`` (position, K, K) of the zarr ``store``.

    ``coords`` (n, 2) float64: the window corners (row, col) in object pixels, fractional in
    general (an int ``top_left`` works too); ``obj`` (Ny, Nx) or (S, Ny, Nx) and ``probe``
    (K, K) or (M, K, K): the starting state (complex64); ``model``: noise, mask, propagator.
    Iterations go on from ``start_iteration`` until ``settings`` says stop; ``losses`` are
    those of the iterations before (resume), ``start_coords`` the positions the refinement
    started from (default: ``coords``), ``curvature`` (n, 3) the positions' Gauss-Newton
    matrices of a checkpoint (``solver.State``).
    """
    coords = np.asarray(coords, np.float64)
    settings.validate(len(coords))
    origin = coords if start_coords is None else np.asarray(start_coords, np.float64)
    host = State(as_slices(np.asarray(obj, np.complex64)), as_modes(np.asarray(probe,
                                                                               np.complex64)),
                 coords.copy(), curvature=curvature)
    trajectory = Trajectory(list(losses))
    if backend == "numpy":  # compile here once, so the workers load from numba's cache
        warm()
    tag = uuid.uuid4().hex[:8]
    bounds = shard_bounds(len(coords), len(_workers(client)), chunk)
    make = (str(store), variable, settings.residency, backend, model, settings, origin)
    actors: list | None = None
    generation = 0
    iteration = start_iteration
    while not trajectory.done(settings):
        for attempt in range(ITERATION_RETRIES + 1):
            try:
                if actors is None:
                    generation += 1
                    actors = _start_actors(client, bounds, make, f"{generation}-{tag}")
                    for future in [actor.begin(host) for _, actor in actors]:
                        future.result()
                before = host.coords
                host = _iteration([actor for _, actor in actors], host, settings, origin,
                                  iteration)
                break
            except LOST as err:
                actors = None
                if attempt == ITERATION_RETRIES:
                    raise OutcoreError(f"Iteration {iteration} failed {attempt + 1} times: {err}",
                                       "check the workers' logs; a run that saved "
                                       "checkpoints can go on from its last one.") from err
        trajectory.record(host.loss, before, host.coords)
        if on_iteration is not None:
            on_iteration(iteration, host.loss, replace(
                host, obj=host.obj.reshape(np.shape(obj)), probe=host.probe.reshape(
                    np.shape(probe))))
        iteration += 1
    actors = None
    return Result(host.obj.reshape(np.shape(obj)), host.probe.reshape(np.shape(probe)),
                  host.coords, np.asarray(trajectory.losses, np.float64), trajectory.stopped)


def _workers(client: distributed.Client) -> list[str]:
    return sorted(client.scheduler_info(n_workers=-1)["workers"])


def _start_actors(client: distributed.Client, bounds: list[tuple[int, int]], make: tuple,
                  tag: str) -> list[tuple[distributed.Future, Any]]:
    """One actor per shard, spread over the workers alive now (in order), each with the
    future that keeps it alive. The placement is a wish (``allow_other_workers``): just after
    a worker died the scheduler may still list it, and an actor held to its address waited
    for it for ever (the killed-worker test hung in 1 run of 8). Just after a worker died the
    scheduler may list none for a moment: wait for one (a nanny restarts it)."""
    workers = _workers(client)
    if not workers:
        client.wait_for_workers(1, timeout=60)
        workers = _workers(client)
    futures = [client.submit(ShardActor, make[0], make[1], a, b, *make[2:], actor=True,
                             workers=[workers[i % len(workers)]], allow_other_workers=True,
                             key=f"ptycho-shard-{i}-{tag}")
               for i, (a, b) in enumerate(bounds)]
    return [(future, future.result()) for future in futures]


def _iteration(actors: list, host: State, settings: Settings, origin: np.ndarray,
               iteration: int) -> State:
    """One iteration from the client's ``host`` state: each step one call of every actor
    with the state, the parts added in shard order and the update applied here (a single
    actor runs the whole iteration itself)."""
    if len(actors) == 1:
        return actors[0].iterate(iteration).result()
    for number, batch in enumerate(batches(len(origin), settings.batch_size, settings.seed,
                                           iteration)):
        fresh = solver.new_curvature(host, batch, settings, iteration)
        sent = replace(host, curvature=None)  # the matrices stay with the client
        calls = [actor.advance(sent, batch, iteration, fresh) for actor in actors]
        summed = _sum([call.result() for call in calls])
        host = solver.step(host, summed, batch, settings, iteration, number == 0, origin)
    return solver.end_iteration(host, settings, iteration, origin)
