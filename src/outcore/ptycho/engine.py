"""Data-parallel mini-batch reconstruction on a Dask cluster: shards, steps, iterations.

The positions are split into contiguous *shards*, one per worker, each loaded once by a task
pinned to its worker (``residency``: ``device`` keeps the shard's amplitudes on the worker's
device, ``host`` in its host memory and copies each sub-batch to the device, ``disk`` reads
each sub-batch from the zarr store (``frames``), the next one in a thread while the current
one computes).

Every iteration walks a seeded permutation of all positions in global batches of
``batch_size`` (the whole scan when None). One step is a graph of futures: each shard sums the
loss and gradients of its part of the batch (``ptycho-terms``); on every shard's worker a
task adds the parts in shard order and applies the preconditioned update to that worker's
copy of the state (``ptycho-step``), so only the terms move between workers. The
batches, the order of the sums and the float64 accumulation do not depend on the number of
workers, so 1, 2 or N workers follow the same loss trajectory to rounding.

After each iteration the client gathers the state (object and probe, small next to the
stack). When a step fails because a worker died, the iteration is replayed from that copy on
the workers that remain, which gives the same result as a clean run.
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
from outcore.checks import at_least, choice
from outcore.errors import OutcoreError
from outcore.ptycho.frames import reader
from outcore.ptycho.kernels import BatchTerms, batch_terms, update

RESIDENCIES: tuple[str, ...] = ("device", "host", "disk")
#: Times one iteration is replayed after a worker failure before the run gives up.
ITERATION_RETRIES = 3


@dataclass(frozen=True)
class Settings:
    """How the reconstruction runs (all independent of the number of workers).

    ``batch_size``: positions per update (global; None = all, one step per iteration).
    ``sub_batch``: positions a shard computes at once (bounds its scratch, not the result).
    ``step_object`` / ``step_probe``: step lengths of the preconditioned updates (1 = the
    ePIE/rPIE projection). ``probe_start``: first iteration (0-based) that updates the probe.
    ``alpha``: rPIE's regularisation of the preconditioner. ``seed``: the batch permutations.
    """

    iterations: int = 50
    batch_size: int | None = None
    residency: str = "host"
    sub_batch: int = 64
    step_object: float = 1.0
    step_probe: float = 1.0
    probe_start: int = 2
    alpha: float = 0.02
    seed: int = 0

    def validate(self, n_positions: int) -> None:
        """Refuse settings that cannot run, before any compute."""
        choice(self.residency, RESIDENCIES, "--residency")
        at_least(self.iterations, "--iterations", what="a positive --iterations")
        at_least(self.sub_batch, "--sub-batch", what="a positive --sub-batch")
        if self.batch_size is not None and not 1 <= self.batch_size <= n_positions:
            raise OutcoreError(
                f"--batch-size {self.batch_size} is not between 1 and the {n_positions} positions.",
                "give a batch size up to the number of positions, or omit it for full batches.")
        if not (self.step_object > 0 and self.step_probe >= 0 and 0 <= self.alpha <= 1):
            raise OutcoreError(
                f"Step lengths {self.step_object}/{self.step_probe} or alpha {self.alpha} are "
                "out of range.", "use a positive object step, a probe step >= 0 and alpha in "
                "[0, 1].")


def batches(n_positions: int, batch_size: int | None, seed: int, iteration: int
            ) -> list[np.ndarray]:
    """The global batches of one iteration: a permutation of ``range(n_positions)`` drawn from
    ``(seed, iteration)``, cut into ``batch_size`` pieces, each sorted (int64 arrays)."""
    if batch_size is None or batch_size >= n_positions:
        return [np.arange(n_positions)]
    order = np.random.default_rng([seed, iteration]).permutation(n_positions)
    return [np.sort(order[i:i + batch_size]) for i in range(0, n_positions, batch_size)]


def shard_bounds(n_positions: int, shards: int, chunk: int = 1) -> list[tuple[int, int]]:
    """Contiguous ``[start, stop)`` ranges of positions, one per shard, cut at multiples of
    ``chunk`` (the store's chunk along ``position``) so no shard reads a chunk twice."""
    chunks = math.ceil(n_positions / chunk)
    shards = max(1, min(shards, chunks))
    edges = [min(round(i * chunks / shards) * chunk, n_positions) for i in range(shards + 1)]
    return [(a, b) for a, b in zip(edges[:-1], edges[1:], strict=True) if b > a]


@dataclass
class Shard:
    """The positions ``[start, stop)`` on one worker: their windows and (unless ``disk``)
    their amplitudes (n, K, K) float32, on the device or in host memory."""

    store: str
    variable: str
    start: int
    stop: int
    top_left: np.ndarray
    residency: str
    backend: str
    amplitudes: Any = None

    def frames(self, local: np.ndarray) -> Any:
        """Amplitudes of the shard's positions ``local`` (sorted, 0-based in the shard)."""
        xp = namespace(self.backend)
        if self.amplitudes is not None:
            return self.amplitudes[xp.asarray(local)] if self.residency == "device" else \
                xp.asarray(self.amplitudes[local])
        return xp.asarray(reader(str(Path(self.store) / self.variable)).read(local + self.start))


def load_shard(store: str, variable: str, start: int, stop: int, top_left: np.ndarray,
               residency: str, backend: str) -> Shard:
    """Read a shard for its residency (a task pinned to the shard's worker)."""
    shard = Shard(store, variable, start, stop, np.asarray(top_left), residency, backend)
    if residency == "disk":
        return shard
    import zarr

    host = np.asarray(zarr.open_array(Path(store) / variable, mode="r")[start:stop],
                      dtype=np.float32)
    if residency == "device":
        shard.amplitudes = namespace(backend).asarray(host)
    else:
        shard.amplitudes = _pinned(host) if backend == "cupy" else host
    return shard


def _pinned(host: np.ndarray) -> np.ndarray:  # pragma: no cover - needs a GPU
    """A copy of ``host`` in page-locked memory, so device copies run at full speed."""
    import cupyx

    out = cupyx.empty_pinned(host.shape, host.dtype)
    out[...] = host
    return out


@dataclass
class State:
    """Object (Ny, Nx) and probe (K, K), complex64, and the loss summed over the steps of the
    current iteration so far."""

    obj: Any
    probe: Any
    loss: float = 0.0


def shard_terms(shard: Shard, state: State, positions: np.ndarray, sub_batch: int
                ) -> BatchTerms:
    """Loss and gradients of the shard's ``positions`` (global indices, sorted), summed over
    sub-batches of ``sub_batch`` in order; the next sub-batch is read while one computes."""
    local = positions - shard.start
    pieces = [local[i:i + sub_batch] for i in range(0, len(local), sub_batch)]
    total: BatchTerms | None = None
    for piece, frames in zip(pieces, _prefetched(shard, pieces), strict=True):
        terms = batch_terms(state.obj, state.probe, shard.top_left[piece], frames)
        total = terms if total is None else total + terms
    assert total is not None
    return total


def _prefetched(shard: Shard, pieces: Sequence[np.ndarray]) -> Iterator[Any]:
    """The frames of each piece in turn, reading the next while the caller computes."""
    if shard.residency == "device" or len(pieces) == 1:
        yield from (shard.frames(p) for p in pieces)
        return
    with ThreadPoolExecutor(1, thread_name_prefix="outcore-prefetch") as pool:
        pending = pool.submit(shard.frames, pieces[0])
        for nxt in [*pieces[1:], None]:
            frames = pending.result()
            if nxt is not None:
                pending = pool.submit(shard.frames, nxt)
            yield frames


def apply_step(state: State, top_left: np.ndarray, settings: Settings, iteration: int,
               first: bool, *parts: BatchTerms) -> State:
    """The state after one batch: the shards' ``parts`` added in the order given, the update,
    and the batch's loss added to the iteration's."""
    terms = parts[0]
    for part in parts[1:]:
        terms = terms + part
    step_probe = settings.step_probe if iteration >= settings.probe_start else 0.0
    obj, probe = update(state.obj, state.probe, terms, top_left, step_obj=settings.step_object,
                        step_probe=step_probe, alpha=settings.alpha)
    return State(obj, probe, terms.loss + (0.0 if first else state.loss))


def state_to_host(state: State) -> State:
    """The state with numpy arrays (what the client keeps between iterations)."""
    return State(to_host(state.obj), to_host(state.probe), state.loss)


def state_to_backend(state: State, backend: str) -> State:
    xp = namespace(backend)
    return replace(state, obj=xp.asarray(state.obj), probe=xp.asarray(state.probe))


@dataclass
class Result:
    """Object (Ny, Nx) and probe (K, K) complex64 numpy arrays, and the loss of every
    iteration (float64, the sum over its batches of the loss before each update)."""

    obj: np.ndarray
    probe: np.ndarray
    loss: np.ndarray


#: Called after each iteration with (iteration, loss, state on the host).
IterationCallback = Callable[[int, float, State], None]


def run(client: distributed.Client, store: str | Path, top_left: np.ndarray, obj: np.ndarray,
        probe: np.ndarray, settings: Settings, *, variable: str = "amplitudes",
        backend: str = "numpy", start_iteration: int = 0, losses: Sequence[float] = (),
        chunk: int = 1, on_iteration: IterationCallback | None = None) -> Result:
    """Reconstruct from the amplitudes ``variable`` (position, K, K) of the zarr ``store``.

    ``top_left`` (n, 2) int64: the window of each position; ``obj`` (Ny, Nx) and ``probe``
    (K, K): the starting state (complex64). Iterations ``start_iteration`` to
    ``settings.iterations - 1`` run; ``losses`` are those of the iterations before (resume).
    """
    top_left = np.asarray(top_left, dtype=np.int64)
    n = len(top_left)
    settings.validate(n)
    tag = uuid.uuid4().hex[:8]
    shards = _load_shards(client, str(store), variable, top_left, settings, backend, chunk, tag)
    host = State(np.asarray(obj, np.complex64), np.asarray(probe, np.complex64))
    history = list(losses)
    for iteration in range(start_iteration, settings.iterations):
        host = _iteration(client, shards, host, top_left, settings, backend, iteration, tag)
        history.append(host.loss)
        if on_iteration is not None:
            on_iteration(iteration, host.loss, host)
    client.cancel([shard.future for shard in shards])
    return Result(host.obj, host.probe, np.asarray(history, np.float64))


@dataclass(frozen=True)
class ShardHandle:
    """A shard's positions ``[start, stop)``, its future and the worker it is pinned to."""

    start: int
    stop: int
    future: distributed.Future
    worker: str

    def select(self, batch: np.ndarray) -> np.ndarray:
        """The batch's positions that this shard holds."""
        return batch[(batch >= self.start) & (batch < self.stop)]


def _load_shards(client: distributed.Client, store: str, variable: str, top_left: np.ndarray,
                 settings: Settings, backend: str, chunk: int, tag: str) -> list[ShardHandle]:
    """One shard per worker, pinned there (and reloaded elsewhere if that worker dies)."""
    workers = sorted(client.scheduler_info(n_workers=-1)["workers"])
    bounds = shard_bounds(len(top_left), len(workers), chunk)
    return [ShardHandle(a, b, client.submit(
                load_shard, store, variable, a, b, top_left[a:b], settings.residency, backend,
                key=f"ptycho-shard-{i}-{tag}", workers=[workers[i]], allow_other_workers=True),
                workers[i])
            for i, (a, b) in enumerate(bounds)]


def _iteration(client: distributed.Client, shards: list[ShardHandle], host: State,
               top_left: np.ndarray, settings: Settings, backend: str, iteration: int,
               tag: str) -> State:
    """Run one iteration from the host state; replay it if a worker dies on the way.

    Every shard's worker keeps its own copy of the state and applies each update itself from
    all shards' terms (added in shard order), so no state moves between workers during an
    iteration: the copies are the same because their inputs and operations are.
    """
    for attempt in range(ITERATION_RETRIES + 1):
        try:
            start = client.scatter(host, hash=False)
            states = [client.submit(state_to_backend, start, backend, workers=[shard.worker],
                                    allow_other_workers=True,
                                    key=f"ptycho-state-{iteration}-{attempt}-{i}-{tag}")
                      for i, shard in enumerate(shards)]
            for step, batch in enumerate(batches(len(top_left), settings.batch_size,
                                                 settings.seed, iteration)):
                key = f"{iteration}-{step}-{attempt}-{tag}"
                parts = [client.submit(shard_terms, shard.future, states[i], part,
                                       settings.sub_batch, key=f"ptycho-terms-{key}-{i}")
                         for i, shard in enumerate(shards) if len(part := shard.select(batch))]
                corners = top_left[batch]
                states = [client.submit(apply_step, states[i], corners, settings, iteration,
                                        step == 0, *parts, key=f"ptycho-step-{key}-{i}",
                                        workers=[shard.worker], allow_other_workers=True)
                          for i, shard in enumerate(shards)]
            return client.submit(state_to_host, states[0], key=f"ptycho-gather-{iteration}-"
                                 f"{attempt}-{tag}").result()
        except (distributed.client.FutureCancelledError, distributed.scheduler.KilledWorker,
                OSError) as err:
            if attempt == ITERATION_RETRIES:
                raise OutcoreError(f"Iteration {iteration} failed {attempt + 1} times: {err}",
                                   "check the workers' logs; the run can go on with "
                                   "--resume from its last checkpoint.") from err
    raise AssertionError("unreachable")
