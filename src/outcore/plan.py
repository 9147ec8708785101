"""Memory planning: operators declare the bytes of each task; a Plan proves a run fits.

An operator describes its graph as a few *stages* (``TaskMemory``), each a kind of task that
appears ``tasks`` times. A task holds its inputs, its output and some transient scratch at
once, so its host peak is their sum; ``device_bytes`` is what it holds on the GPU at once
(zero on the numpy backend). A worker runs ``threads_per_worker`` tasks at a time, so its
projected peak is that many of the largest task plus a fixed baseline for the interpreter and
libraries. Dask starts spilling at 60 % of a worker's limit and pauses at 80 %; a plan must
keep its projection under the *budget* (``target_fraction`` of the limit, 0.6 by default) so
that streaming never waits on spilling. On a GPU the device projection (concurrent tasks'
``device_bytes`` plus the CUDA context) must stay under ``device_fraction`` of the device
limit: ``--device-memory-limit``, else the GPU's free memory.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from dask.utils import format_bytes, parse_bytes

from outcore import backend
from outcore.errors import ClusterError, PlanError

if TYPE_CHECKING:
    import distributed

    from outcore.cluster import ClusterOptions

log = logging.getLogger(__name__)

#: Resident memory of a worker process that has run outcore tasks (Python, numpy, dask,
#: distributed, zarr, blosc, xarray), bytes: 170-220 MiB measured with VmHWM here.
WORKER_BASELINE_BYTES = 200 * 2**20
#: Device memory a GPU worker holds before any task: the CUDA context, cuFFT plans and the
#: slack of cupy's memory pool, bytes (an allowance; the GPU run of benchmarks/gpu measures).
DEVICE_BASELINE_BYTES = 512 * 2**20
#: Bytes of one element of the dtypes memory models count in.
F32, F64, C64, C128 = 4, 8, 8, 16
#: Bytes a zarr read holds per byte of chunk at its peak: the encoded bytes read from the
#: store, the decoded buffer and the array it is copied into (measured 2.9-3.0 with
#: tracemalloc for incompressible float32; tests/test_plan.py checks it).
ZARR_READ_FACTOR = 3.0


def zarr_read_bytes(chunk_bytes: int) -> int:
    """Scratch of reading one zarr chunk of ``chunk_bytes`` (decoded), besides the array it
    fills: the encoded bytes and the decoded buffer (``ZARR_READ_FACTOR``)."""
    return int((ZARR_READ_FACTOR - 1) * chunk_bytes)


#: Seconds a plan waits for a worker of a cluster that has none at the moment.
WORKER_WAIT_S = 60


@dataclass(frozen=True)
class Resources:
    """What a plan is made for: workers, threads per worker, memory limit per worker (bytes),
    the array backend and, on the cupy backend, the device memory per worker (bytes; None:
    unknown, then no device check is made)."""

    workers: int
    threads_per_worker: int
    memory_limit: int | None
    backend: str = "numpy"
    device_memory_limit: int | None = None

    @classmethod
    def of_client(cls, client: distributed.Client, backend_name: str,
                  device_memory_limit: int | str | None = None) -> Resources:
        """The resources of a running cluster (the smallest worker's memory limit; on cupy
        ``device_memory_limit``, else the smallest free GPU memory among the workers). A
        cluster with no running worker at the moment (one restarting, MPI ranks still
        connecting) is waited for up to ``WORKER_WAIT_S``, then one ``ClusterError``."""
        workers = client.scheduler_info(n_workers=-1)["workers"].values()
        if not workers:
            try:
                client.wait_for_workers(1, timeout=WORKER_WAIT_S)
            except TimeoutError as err:  # distributed's WorkerStartTimeoutError is one
                raise ClusterError(
                    f"the cluster of {client.scheduler.address} has no running worker"
                    f" (waited {WORKER_WAIT_S} s).",
                    "start its workers, or pass client= one that has them.") from err
            workers = client.scheduler_info(n_workers=-1)["workers"].values()
        limits = [int(w["memory_limit"]) for w in workers if w.get("memory_limit")]
        device = _bytes(device_memory_limit)
        if backend_name == "cupy" and device is None:
            free = [f for f in client.run(device_free_bytes).values() if f is not None]
            device = min(free) if free else None
        return cls(
            workers=len(workers),
            threads_per_worker=max(int(w["nthreads"]) for w in workers),
            memory_limit=min(limits) if limits else None,
            backend=backend_name,
            device_memory_limit=device if backend_name == "cupy" else None,
        )

    @classmethod
    def of_options(cls, opts: ClusterOptions, backend_name: str) -> Resources:
        """What a cluster started from these options would get (nothing is started).

        Workers: ``--workers``, else what that kind starts by default (cuda: one per GPU;
        local and threads: min(CPUs, 4)). Memory: ``--memory-limit`` as dask reads it
        (bytes, a size string, a fraction of RAM, or ``auto`` = RAM x threads / cores).
        Device: ``--device-memory-limit``, else the smallest free memory of this machine's
        GPUs.
        """
        gpus = backend.devices()
        workers = opts.default_workers()
        limit = worker_memory_limit(opts.memory_limit, opts.threads_per_worker)
        device = _bytes(opts.device_memory_limit)
        if device is None and gpus:
            device = min(g["free_bytes"] for g in gpus)
        return cls(workers, opts.threads_per_worker, limit, backend_name,
                   device if backend_name == "cupy" else None)


def worker_memory_limit(given: int | str | None, threads_per_worker: int = 1) -> int | None:
    """The bytes of memory each worker gets from ``--memory-limit`` ``given``, as dask reads
    it (``distributed.worker_memory.parse_memory_limit``'s rules, here without importing
    distributed): bytes, a size string, a fraction of the memory this process may use
    (``backend.memory_limit``), or ``auto`` (also None) = that memory x threads / cores;
    capped at that memory, None for 0."""
    whole = backend.memory_limit()
    if given is None or given == "auto":
        limit = int(whole * min(1.0, threads_per_worker / (os.cpu_count() or 1)))
    elif isinstance(given, str) and not _is_number(given):
        limit = int(parse_bytes(given))
    else:
        number = float(given)
        limit = int(number * whole) if number <= 1 else int(number)
    if limit == 0:
        return None
    if limit > whole:
        log.warning("Ignoring provided memory limit %s due to system memory limit of %s",
                    given, format_bytes(whole))
        return whole
    return limit


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def least_memory_limit(baseline_bytes: int = WORKER_BASELINE_BYTES,
                       target_fraction: float = 0.6) -> int:
    """The smallest memory limit per worker under which any plan can fit, bytes: a worker's
    resident baseline inside the budget (``target_fraction`` of the limit), 334 MiB for the
    measured 200 MiB. Below it a worker cannot even hold itself: dask pauses it, or its nanny
    restarts it, over and over."""
    return math.ceil(baseline_bytes / target_fraction)


def _bytes(size: int | str | None) -> int | None:
    return None if size is None else int(parse_bytes(size) if isinstance(size, str) else size)


def device_free_bytes() -> int | None:
    """On a worker: free memory of its GPU in bytes (None without one)."""
    gpus = backend.devices()
    return gpus[0]["free_bytes"] if gpus else None


@dataclass(frozen=True)
class TaskMemory:
    """Memory of one kind of task in a graph (all sizes in bytes, for one task)."""

    name: str
    tasks: int
    input_bytes: int
    output_bytes: int
    transient_bytes: int = 0
    read_bytes: int = 0
    write_bytes: int = 0
    device_bytes: int = 0
    """Bytes the task holds on the GPU at once (inputs, output, scratch there)."""

    @property
    def peak_bytes(self) -> int:
        """Bytes one task holds at its peak: inputs, output and scratch together."""
        return self.input_bytes + self.output_bytes + self.transient_bytes


def data_bytes(stages: Sequence[TaskMemory]) -> int:
    """Bytes that ``stages`` read and write, over all their tasks."""
    return sum(s.tasks * (s.read_bytes + s.write_bytes) for s in stages)


@dataclass
class Plan:
    """The stages of a run and the workers it runs on; ``check`` refuses one that cannot fit.

    ``memory_limit`` and ``device_memory_limit`` are per worker in bytes (or a string such
    as ``"2 GiB"``); ``None`` means unlimited (that side is then only reported, never refused).
    """

    stages: Sequence[TaskMemory]
    workers: int = 1
    threads_per_worker: int = 1
    memory_limit: int | str | None = None
    target_fraction: float = 0.6
    baseline_bytes: int = WORKER_BASELINE_BYTES
    notes: list[str] = field(default_factory=list)
    device_memory_limit: int | str | None = None
    device_fraction: float = 0.9
    device_baseline_bytes: int = DEVICE_BASELINE_BYTES
    resident_bytes: int = 0
    """Host bytes each worker holds across tasks (an iterative solver's vectors kept in
    worker memory), on top of its tasks."""
    choices: Any = None
    """What the job chose to fit these resources (a projector and its blocks, a tile size),
    which its ``execute`` receives with the plan; opaque here."""
    config: dict[str, Any] = field(default_factory=dict)
    """The effective-config entries of those choices, recorded in the run."""

    def __post_init__(self) -> None:
        self.memory_limit = _bytes(self.memory_limit)
        self.device_memory_limit = _bytes(self.device_memory_limit)
        if not self.stages:
            raise ValueError("a Plan needs at least one stage")

    @classmethod
    def of(cls, stages: Sequence[TaskMemory], resources: Resources, **options: Any) -> Plan:
        """The plan of ``stages`` on ``resources`` (workers, threads, host and device limits);
        ``options`` are further fields (``baseline_bytes``, ``notes``, ...)."""
        return cls(stages, resources.workers, resources.threads_per_worker,
                   resources.memory_limit, device_memory_limit=resources.device_memory_limit,
                   **options)

    @property
    def largest_task(self) -> TaskMemory:
        return max(self.stages, key=lambda s: s.peak_bytes)

    @property
    def worker_peak_bytes(self) -> int:
        """Projected peak of one worker: its concurrent tasks at their largest, plus baseline."""
        concurrent = min(self.threads_per_worker, max(s.tasks for s in self.stages))
        tasks = concurrent * self.largest_task.peak_bytes
        return self.baseline_bytes + self.resident_bytes + tasks

    @property
    def data_bytes(self) -> int:
        """Bytes the whole run reads and writes, over every task of every stage."""
        return data_bytes(self.stages)

    @property
    def budget_bytes(self) -> int | None:
        if self.memory_limit is None:
            return None
        return int(self.target_fraction * self.memory_limit)

    @property
    def uses_device(self) -> bool:
        return any(s.device_bytes for s in self.stages)

    @property
    def largest_device_task(self) -> TaskMemory:
        return max(self.stages, key=lambda s: s.device_bytes)

    @property
    def device_peak_bytes(self) -> int:
        """Projected device memory of one GPU worker: its concurrent tasks' device bytes at
        their largest plus the CUDA context (0 when no stage uses the device)."""
        if not self.uses_device:
            return 0
        concurrent = min(self.threads_per_worker, max(s.tasks for s in self.stages))
        return self.device_baseline_bytes + concurrent * self.largest_device_task.device_bytes

    @property
    def device_budget_bytes(self) -> int | None:
        if self.device_memory_limit is None:
            return None
        return int(self.device_fraction * self.device_memory_limit)

    @property
    def host_fits(self) -> bool:
        return self.budget_bytes is None or self.worker_peak_bytes <= self.budget_bytes

    @property
    def device_fits(self) -> bool:
        budget = self.device_budget_bytes
        return budget is None or self.device_peak_bytes <= budget

    @property
    def fits(self) -> bool:
        return self.host_fits and self.device_fits

    def check(self, fixes: Sequence[str] = (), device_fixes: Sequence[str] = ()) -> Plan:
        """Return self when the plan fits its budgets; raise ``PlanError`` naming the fix
        (``fixes`` for the host memory, ``device_fixes`` for the GPU's)."""
        if not self.host_fits:
            self._refuse_host(fixes)
        if not self.device_fits:
            self._refuse_device(device_fixes or fixes)
        return self

    def _refuse_device(self, fixes: Sequence[str]) -> None:
        task = self.largest_device_task
        needed = int(self.device_peak_bytes / self.device_fraction) + 1
        advice = [*(fixes or ["use a smaller chunk size"]),
                  f"use more GPUs (workers={2 * self.workers} or more), where the work"
                  " splits over them",
                  f"give each worker a GPU with {format_bytes(needed)} or more free"]
        raise PlanError(
            f"The plan does not fit the GPU: each worker would hold"
            f" {format_bytes(self.device_peak_bytes)} of device memory"
            f" ({self.threads_per_worker} concurrent '{task.name}' task(s) of"
            f" {format_bytes(task.device_bytes)} plus {format_bytes(self.device_baseline_bytes)}"
            f" for the CUDA context), over its budget of"
            f" {format_bytes(self.device_budget_bytes or 0)} ({self.device_fraction:.0%} of"
            f" {format_bytes(int(self.device_memory_limit or 0))} of device memory).",
            "; or ".join(advice) + ".",
        )

    def _refuse_host(self, fixes: Sequence[str]) -> None:
        task = self.largest_task
        advice = [*(fixes or ["use a smaller chunk size"]),
                  f"raise memory_limit= to {format_bytes(self.needed_limit_bytes)} or more"]
        if self.threads_per_worker > 1:
            advice.append("use fewer threads per worker")
        raise PlanError(
            f"The plan does not fit: each worker would hold {format_bytes(self.worker_peak_bytes)}"
            f" ({self.threads_per_worker} concurrent '{task.name}' task(s) of"
            f" {format_bytes(task.peak_bytes)} plus {format_bytes(self.baseline_bytes)} baseline"
            + (f" and {format_bytes(self.resident_bytes)} held across tasks"
               if self.resident_bytes else "") + "),"
            f" over its budget of {format_bytes(self.budget_bytes or 0)}"
            f" ({self.target_fraction:.0%} of the {format_bytes(int(self.memory_limit or 0))}"
            " memory limit).",
            "; or ".join(advice) + ".",
        )

    @property
    def needed_limit_bytes(self) -> int:
        """The smallest per-worker memory limit under which this plan fits."""
        return int(self.worker_peak_bytes / self.target_fraction) + 1

    def table(self) -> str:
        """A plain-text table of the stages and the per-worker projection (host, and the
        device when a stage uses one)."""
        device = self.uses_device or self.device_memory_limit is not None
        head = (f"{'stage':<22}{'tasks':>8}{'per task':>12}" + (f"{'device':>12}" if device
                                                                   else "")
                + f"{'read':>12}{'write':>12}")
        lines = [head, "-" * len(head)]
        for s in self.stages:
            lines.append(
                f"{s.name:<22}{s.tasks:>8}{format_bytes(s.peak_bytes):>12}"
                + (f"{format_bytes(s.device_bytes):>12}" if device else "")
                + f"{format_bytes(s.tasks * s.read_bytes):>12}"
                f"{format_bytes(s.tasks * s.write_bytes):>12}"
            )
        lines.append("-" * len(head))
        limit = "unlimited" if self.memory_limit is None else format_bytes(int(self.memory_limit))
        lines.append(
            f"workers: {self.workers} x {self.threads_per_worker} thread(s); projected peak per"
            f" worker {format_bytes(self.worker_peak_bytes)}; limit {limit}"
            + ("" if self.budget_bytes is None else f" (budget {format_bytes(self.budget_bytes)})")
            + ("; fits" if self.host_fits else "; DOES NOT FIT")
        )
        if device:
            gpu = ("unknown" if self.device_memory_limit is None
                   else format_bytes(int(self.device_memory_limit)))
            budget = self.device_budget_bytes
            lines.append(
                f"device: projected peak per GPU worker {format_bytes(self.device_peak_bytes)};"
                f" device memory {gpu}"
                + ("" if budget is None else f" (budget {format_bytes(budget)})")
                + ("; fits" if self.device_fits else "; DOES NOT FIT"))
        if self.resident_bytes:
            lines.append(f"held across tasks per worker: {format_bytes(self.resident_bytes)}"
                         " (included in the projected peak)")
        lines.extend(self.notes)
        return "\n".join(lines)

    def to_dict(self) -> dict:
        """A JSON-ready record of the plan for summary.json."""
        return {
            "stages": [asdict(s) | {"peak_bytes": s.peak_bytes} for s in self.stages],
            "workers": self.workers,
            "threads_per_worker": self.threads_per_worker,
            "memory_limit_bytes": self.memory_limit,
            "budget_bytes": self.budget_bytes,
            "worker_peak_bytes": self.worker_peak_bytes,
            "resident_bytes": self.resident_bytes,
            "device_memory_limit_bytes": self.device_memory_limit,
            "device_budget_bytes": self.device_budget_bytes,
            "device_peak_bytes": self.device_peak_bytes,
            "fits": self.fits,
            "notes": list(self.notes),
        }


def suggest_chunk(
    plan_for: Callable[[int], Plan], candidates: Sequence[int], fixes: Sequence[str] = ()
) -> tuple[int, Plan]:
    """The largest chunk size among ``candidates`` whose plan fits, and that plan.

    ``plan_for(chunk)`` builds the plan for one chunk size. Raises ``PlanError`` when even
    the smallest candidate does not fit, with that plan's own explanation and ``fixes`` (the
    job's own ways to shrink it).
    """
    ordered = sorted(set(candidates))
    best: tuple[int, Plan] | None = None
    for chunk in ordered:
        plan = plan_for(chunk)
        if not plan.fits:
            break
        best = (chunk, plan)
    if best is None:
        plan_for(ordered[0]).check(fixes)
        raise AssertionError("unreachable: the smallest plan fits after all")
    return best
