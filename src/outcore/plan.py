"""Memory planning: operators declare the bytes of each task; a Plan proves a run fits.

An operator describes its graph as a few *stages* (``TaskMemory``), each a kind of task that
appears ``tasks`` times. A task holds its inputs, its output and some transient scratch at
once, so its peak is their sum. A worker runs ``threads_per_worker`` tasks at a time, so its
projected peak is that many of the largest task plus a fixed baseline for the interpreter and
libraries. Dask starts spilling at 60 % of a worker's limit and pauses at 80 %; a plan must
keep its projection under the *budget* (``target_fraction`` of the limit, 0.6 by default) so
that streaming never waits on spilling.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

from dask.utils import format_bytes, parse_bytes

from outcore.errors import PlanError

#: Resident memory of a worker process that has run outcore tasks (Python, numpy, dask,
#: distributed, zarr, blosc, xarray), bytes: 170-220 MiB measured with VmHWM here.
WORKER_BASELINE_BYTES = 200 * 2**20


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

    @property
    def peak_bytes(self) -> int:
        """Bytes one task holds at its peak: inputs, output and scratch together."""
        return self.input_bytes + self.output_bytes + self.transient_bytes


@dataclass
class Plan:
    """The stages of a run and the workers it runs on; ``check`` refuses one that cannot fit.

    ``memory_limit`` is per worker in bytes (or a string such as ``"2 GiB"``); ``None``
    means unlimited (a plan is then only reported, never refused).
    """

    stages: Sequence[TaskMemory]
    workers: int = 1
    threads_per_worker: int = 1
    memory_limit: int | str | None = None
    target_fraction: float = 0.6
    baseline_bytes: int = WORKER_BASELINE_BYTES
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if isinstance(self.memory_limit, str):
            self.memory_limit = parse_bytes(self.memory_limit)
        if not self.stages:
            raise ValueError("a Plan needs at least one stage")

    @property
    def largest_task(self) -> TaskMemory:
        return max(self.stages, key=lambda s: s.peak_bytes)

    @property
    def worker_peak_bytes(self) -> int:
        """Projected peak of one worker: its concurrent tasks at their largest, plus baseline."""
        concurrent = min(self.threads_per_worker, max(s.tasks for s in self.stages))
        return self.baseline_bytes + concurrent * self.largest_task.peak_bytes

    @property
    def budget_bytes(self) -> int | None:
        if self.memory_limit is None:
            return None
        return int(self.target_fraction * self.memory_limit)

    @property
    def fits(self) -> bool:
        return self.budget_bytes is None or self.worker_peak_bytes <= self.budget_bytes

    def check(self, fixes: Sequence[str] = ()) -> Plan:
        """Return self when the plan fits its budget; raise ``PlanError`` naming the fix."""
        if self.fits:
            return self
        task = self.largest_task
        advice = [*(fixes or ["use a smaller chunk size"]),
                  f"raise --memory-limit to {format_bytes(self.needed_limit_bytes)} or more"]
        if self.threads_per_worker > 1:
            advice.append("use fewer threads per worker")
        raise PlanError(
            f"The plan does not fit: each worker would hold {format_bytes(self.worker_peak_bytes)}"
            f" ({self.threads_per_worker} concurrent '{task.name}' task(s) of"
            f" {format_bytes(task.peak_bytes)} plus {format_bytes(self.baseline_bytes)} baseline),"
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
        """A plain-text table of the stages and the per-worker projection."""
        head = f"{'stage':<22}{'tasks':>8}{'per task':>12}{'read':>12}{'write':>12}"
        lines = [head, "-" * len(head)]
        for s in self.stages:
            lines.append(
                f"{s.name:<22}{s.tasks:>8}{format_bytes(s.peak_bytes):>12}"
                f"{format_bytes(s.tasks * s.read_bytes):>12}"
                f"{format_bytes(s.tasks * s.write_bytes):>12}"
            )
        lines.append("-" * len(head))
        limit = "unlimited" if self.memory_limit is None else format_bytes(int(self.memory_limit))
        lines.append(
            f"workers: {self.workers} x {self.threads_per_worker} thread(s); projected peak per"
            f" worker {format_bytes(self.worker_peak_bytes)}; limit {limit}"
            + ("" if self.budget_bytes is None else f" (budget {format_bytes(self.budget_bytes)})")
            + ("; fits" if self.fits else "; DOES NOT FIT")
        )
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
            "fits": self.fits,
        }


def suggest_chunk(
    plan_for: Callable[[int], Plan], candidates: Sequence[int]
) -> tuple[int, Plan]:
    """The largest chunk size among ``candidates`` whose plan fits, and that plan.

    ``plan_for(chunk)`` builds the plan for one chunk size. Raises ``PlanError`` when even
    the smallest candidate does not fit, with that plan's own explanation.
    """
    ordered = sorted(set(candidates))
    best: tuple[int, Plan] | None = None
    for chunk in ordered:
        plan = plan_for(chunk)
        if not plan.fits:
            break
        best = (chunk, plan)
    if best is None:
        plan_for(ordered[0]).check()
        raise AssertionError("unreachable: the smallest plan fits after all")
    return best
