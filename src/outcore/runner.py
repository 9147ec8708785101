"""Run one job end to end: validate, start the cluster, plan, record, execute, finish.

A verb of the CLI turns its arguments into a ``Job`` (checking its inputs lazily, before
anything starts) and hands it to ``run_job``. The order guarantees that bad input, an option
that does not apply, an existing run directory or a plan that cannot fit all fail before any
compute and before anything is written.
"""

from __future__ import annotations

import _thread
import contextlib
import datetime as dt
import json
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dask
import dask.threaded
from dask.utils import format_bytes

from outcore import backend, cluster
from outcore.errors import OutcoreError, refuse_existing, translate
from outcore.plan import Plan, Resources
from outcore.progress import SHOW_PROGRESS
from outcore.runs import Run, input_record, process_age_s, sha256_path
from outcore.settings import RunSettings, in_flags
from outcore.verbs import Job

if TYPE_CHECKING:
    import distributed

log = logging.getLogger(__name__)

#: Seconds a run waits with every worker paused for memory before it is ended as failed.
PAUSED_GRACE_S = 60.0
#: Seconds a run waits for a scheduler that stopped answering before it is ended as failed.
SCHEDULER_GRACE_S = 30.0


def default_run_name(command: str) -> str:
    """``command-YYYYmmddTHHMMSS`` (UTC); family verbs such as "tomo simulate" get a dash."""
    return f"{command.replace(' ', '-')}-{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%S}"


def run_job(settings: RunSettings, job_factory: Callable[[Resources], Job]) -> dict[str, Any]:
    """Run a job and return its final summary; raises ``OutcoreError`` on bad input or plans.

    ``job_factory(resources)`` builds the job for the resources the options describe (the
    resolved backend among them); it must only read metadata (lazy opens, validation), so
    that its errors come before the cluster starts. The job is planned once, on the running
    cluster's resources, and that plan is what the run records and executes.

    Until a cluster's client says otherwise, dask computes here on its threaded scheduler,
    given as its function: named, or left to dask, it would import distributed only to look
    for a client, which a run on dask's threaded scheduler never needs.
    """
    with dask.config.set(scheduler=dask.threaded.get):
        return _run_job(settings, job_factory)


def _run_job(settings: RunSettings, job_factory: Callable[[Resources], Job]) -> dict[str, Any]:
    timings = {"start": round(process_age_s(), 6)}  # interpreter, imports, parsing
    t0 = time.perf_counter()
    kind = settings.cluster.validate()
    settings.validate()
    if kind == "mpi":  # before anything probes CUDA: it reads CUDA_VISIBLE_DEVICES once
        cluster.pin_mpi_worker_gpu()
    backend_name = backend.resolve(settings.backend)
    job = job_factory(Resources.of_options(settings.cluster, backend_name))
    settings.check_memory_limit(job.worker_baseline_bytes)
    job.config["backend_resolved"] = backend_name
    SHOW_PROGRESS.set(settings.progress)
    name = settings.name or default_run_name(job.command)
    run_path = refuse_existing(Path(settings.output_dir) / name)
    opts, why = chosen_cluster(settings.cluster, job)
    kind = opts.resolved_kind()
    threaded = on_threaded_scheduler(opts, settings, job)
    timings["prepare"] = _since(t0)
    t0 = time.perf_counter()
    client = None if threaded else cluster.start(opts.kind, **_cluster_kwargs(opts))
    timings["cluster"] = _since(t0)
    exit_code = 1
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        print(f"cluster: {kind}, {_where(client)}", flush=True)
        if why:
            print(f"note: {why}; --cluster local starts worker processes", flush=True)
        t0 = time.perf_counter()
        resources = (Resources.of_options(opts, backend_name) if client is None else
                     Resources.of_client(client, backend_name,
                                         settings.cluster.device_memory_limit))
        plan = job.plan(resources)
        capped = settings.memory_limit_note(resources)
        if capped:  # in the table and in the summary's plan
            plan.notes.append(capped)
        print(plan.table(), flush=True)
        plan.check(job.plan_fixes, job.device_fixes)
        timings["plan"] = _since(t0)
        run = Run.create(run_path.parent, run_path.name, job.command,
                         _config(job, settings, plan))
        run.record["timings_s"].update(timings)
        with contextlib.nullcontext() if client else threaded_scheduler(resources):
            summary = _execute(run, client, job, plan, settings, kind, why)
        exit_code = 0
        return summary
    finally:
        signal.signal(signal.SIGTERM, previous)
        if client is not None:
            cluster.stop(client, exit_code)


def on_threaded_scheduler(opts: cluster.ClusterOptions, settings: RunSettings, job: Job) -> bool:
    """Whether ``job`` runs on dask's threaded scheduler in this process, no Dask cluster
    started: its workers are threads of this process (``threads``, or ``auto``'s choice of
    it), it computes only dask collections (``Job.local_scheduler``), and nothing asks for
    what only a cluster gives: a dashboard (``--dashboard``), Dask's performance report
    (``--report always``), a memory limit each worker holds to (``--memory-limit``) or a
    watch on stuck tasks (``--worker-timeout``). A short job saves importing and starting
    distributed's scheduler and its cost of each task, which together come to a third of a
    no-op ``fit-dipoles`` beyond the libraries' imports."""
    return (opts.resolved_kind() == "threads" and job.local_scheduler and not opts.dashboard
            and settings.report != "always" and opts.memory_limit is None
            and settings.worker_timeout is None)


@contextlib.contextmanager
def threaded_scheduler(resources: Resources) -> Iterator[None]:
    """dask's threaded scheduler with a thread for each thread of the plan's workers, the
    default of every ``dask.compute`` inside; rechunks by tasks, as dask chooses without a
    client (said here: to find that out, dask imports distributed)."""
    with dask.config.set({"scheduler": dask.threaded.get, "array.rechunk.method": "tasks",
                          "num_workers": resources.workers * resources.threads_per_worker}):
        yield


def _where(client: distributed.Client | None) -> str:
    """How the ``cluster:`` line names where the job runs: the dashboard's link, or that
    there is none and the flag that serves one."""
    if client is None:
        return "dask's threaded scheduler in this process, no dashboard (--dashboard serves one)"
    if client.dashboard_link:
        return f"dashboard {client.dashboard_link}"
    return "no dashboard (--dashboard serves one)"


def _since(t0: float) -> float:
    return round(time.perf_counter() - t0, 6)


def chosen_cluster(opts: cluster.ClusterOptions,
                   job: Job) -> tuple[cluster.ClusterOptions, str | None]:
    """The cluster to start for ``job``: ``opts``, or, where ``auto`` finds the job's data
    (``Job.data_bytes``) small (``cluster.in_process_reason``), workers that are threads of
    this process; and the reason for that choice (None when there was none to make)."""
    why = cluster.in_process_reason(opts, job.data_bytes)
    return (replace(opts, kind="threads"), why) if why else (opts, None)


def _terminated(signum: int, frame: object) -> None:
    """SIGTERM (Slurm's time limit, scancel) ends the run as failed, with its reason."""
    raise SystemExit(f"terminated by signal {signum}")


def _execute(
    run: Run, client: distributed.Client | None, job: Job, plan: Plan, settings: RunSettings,
    kind: str, why: str | None,
) -> dict[str, Any]:
    try:
        run.set(
            "cluster",
            {
                "kind": kind,
                "requested": settings.cluster.kind,
                "why": why,
                "scheduler": client.scheduler.address if client else "dask.threaded",
                "dashboard": (client.dashboard_link or None) if client else None,
                "workers": (cluster.placement(client) if client else
                            [cluster.this_process(plan.workers * plan.threads_per_worker)]),
            },
        )
        run.set("plan", plan.to_dict())
        hashes = InputHashes(run, job.inputs)
        with hashes, RunWatchdog(client, settings.worker_timeout) as watchdog:
            try:
                with run.performance_report(settings.report, cluster=client is not None), \
                        run.timing("execute"):
                    job.execute(run, client, plan)
                if job.rounds is not None and (
                    settings.warmup_rounds or settings.measure_rounds > 1
                ):
                    with run.timing("rounds"):
                        run.rounds(job.rounds(client, plan, run.outputs()),
                                   settings.warmup_rounds, settings.measure_rounds)
            except KeyboardInterrupt:
                watchdog.raise_if_fired()
                raise
            except Exception as err:
                if client is not None and client.status != "running":
                    raise OutcoreError(
                        f"Lost the scheduler at {run.record['cluster']['scheduler']} during the"
                        f" run ({type(err).__name__}: {err}).",
                        "check the scheduler's log for why it stopped, then run again.",
                    ) from err
                raise
            hashes.wait()
        run.metric(peak_worker_rss_bytes=peak_worker_rss(client))
        return run.finish()
    except Exception as err:
        user = translate(err, job.inputs)  # a full disk, a damaged input: the user's error
        if user is not None and settings.flags:
            user = in_flags(user, settings.flags)  # type: ignore[assignment]
        if user is None or user is err:
            run.fail(err)
            raise
        run.fail(user)
        raise user from err
    except BaseException as err:
        run.fail(err)
        raise


class InputHashes:
    """The SHA-256 of a run's inputs, taken in a thread while the job runs.

    hashlib releases the GIL, so the hashes overlap the compute instead of delaying it
    (SHA-256 reads about 1.7 GB/s on one core here: a 100 GB stack would otherwise hold its
    run back a minute). The inputs are written to the summary at once, their ``sha256`` null
    (so that the summary already has its size when a full disk fails the run); ``wait``
    fills the hashes in, with ``timings_s.hash_inputs`` the hashing's own seconds. Leaving
    the block without ``wait`` (the job failed or was interrupted) stops the hashing at its
    next block and leaves the hashes finished by then in the record, for ``Run.fail`` to
    write.
    """

    def __init__(self, run: Run, paths: list[Path]) -> None:
        self.run = run
        self.entries = [input_record(path) for path in paths]
        run.record_inputs(self.entries)
        self._digests: list[str | None] = []
        self._error: BaseException | None = None
        self._seconds = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._hash, daemon=True, name="outcore-hash")

    def __enter__(self) -> InputHashes:
        self._thread.start()
        return self

    def _hash(self) -> None:
        t0 = time.perf_counter()
        try:
            for entry in self.entries:
                try:
                    self._digests.append(sha256_path(entry["path"], self._stop))
                except InterruptedError:
                    self._digests.append(None)
        except BaseException as err:  # raised by wait, in the run's own thread
            self._error = err
        self._seconds = time.perf_counter() - t0

    def _finish(self) -> None:
        """Join the thread and put the hashes finished into the record (not written); a
        second call changes nothing."""
        self._thread.join()
        for entry, digest in zip(self.entries, self._digests, strict=False):
            entry["sha256"] = digest
        self.run.record["timings_s"]["hash_inputs"] = round(self._seconds, 6)

    def wait(self) -> None:
        """Wait for the hashes and write them to the summary; raises what hashing raised."""
        self._finish()
        if self._error is not None:
            raise self._error
        self.run.set("inputs", self.run.record["inputs"])

    def __exit__(self, *exc: object) -> None:
        self._stop.set()  # after wait, the thread has ended and this changes nothing
        self._finish()


class RunWatchdog:
    """Ends a run that can no longer progress, instead of letting it wait forever.

    It polls the scheduler once a second and fires when every worker has stayed paused for
    memory (dask pauses a worker at 80 % of its limit) for ``PAUSED_GRACE_S``, when one task
    has been processing for more than ``worker_timeout`` seconds (``--worker-timeout``), or
    when the scheduler has not answered for ``SCHEDULER_GRACE_S``. Firing interrupts the main
    thread; ``run_job`` turns that into a failed run with the reason and a fix. Without a
    client (dask's threaded scheduler: nothing pauses, no scheduler to lose) it watches
    nothing.
    """

    def __init__(self, client: distributed.Client | None,
                 worker_timeout: float | None = None) -> None:
        self.client = client
        self.worker_timeout = worker_timeout
        self.reason: tuple[str, str] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True, name="outcore-watch")

    def __enter__(self) -> RunWatchdog:
        if self.client is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _watch(self) -> None:
        paused_since = silent_since = None
        first_seen: dict[str, float] = {}
        while not self._stop.wait(1.0):
            now = time.monotonic()
            try:
                workers = list(self.client.scheduler_info(n_workers=-1)["workers"].values())
                processing = {k for keys in self.client.processing().values() for k in keys}
                silent_since = None
            except Exception:
                silent_since = silent_since or now
                if now - silent_since > SCHEDULER_GRACE_S:
                    self._fire(f"The scheduler has not answered for {SCHEDULER_GRACE_S:.0f} s.",
                               "check that the scheduler is running (its log says why it"
                               " stopped), then run again.")
                    return
                continue
            if workers and all(w.get("status") == "paused" for w in workers):
                paused_since = paused_since or now
                if now - paused_since > PAUSED_GRACE_S:
                    limit = min(int(w.get("memory_limit") or 0) for w in workers)
                    self._fire(
                        f"Every worker has been paused for over {PAUSED_GRACE_S:.0f} s: their"
                        f" memory stays above 80 % of the {format_bytes(limit)} limit, so dask"
                        " runs no task and the run cannot progress.",
                        "raise --memory-limit (400 MiB or more per worker), or use a smaller"
                        " chunk size.")
                    return
            else:
                paused_since = None
            first_seen = {k: first_seen.get(k, now) for k in map(str, processing)}
            stuck = [k for k, t in first_seen.items()
                     if self.worker_timeout and now - t > self.worker_timeout]
            if stuck:
                self._fire(f"Task {stuck[0]} has run for over {self.worker_timeout:.0f} s"
                           " (--worker-timeout).",
                           "look at the dashboard's call stack of that task; raise"
                           " --worker-timeout if such tasks are expected to take longer.")
                return

    def _fire(self, problem: str, fix: str) -> None:
        self.reason = (problem, fix)
        _thread.interrupt_main()

    def raise_if_fired(self) -> None:
        if self.reason is not None:
            raise OutcoreError(*self.reason)


def _cluster_kwargs(opts: cluster.ClusterOptions) -> dict[str, Any]:
    return {k: v for k, v in vars(opts).items() if k != "kind"}


def _config(job: Job, settings: RunSettings, plan: Plan) -> dict[str, Any]:
    return {"command": job.command, **settings.to_record(), **job.config, **plan.config}


def _max_rss() -> int:
    """This process's peak resident memory in bytes since it started its program.

    Linux's VmHWM (the high-water mark of this program's own memory map); ``ru_maxrss``
    elsewhere, which on Linux would also count the parent's pages at fork.
    """
    try:
        with open("/proc/self/status") as status:
            for row in status:
                if row.startswith("VmHWM:"):
                    return int(row.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def peak_worker_rss(client: distributed.Client | None) -> dict[str, int]:
    """Each worker process's peak resident memory in bytes (the kernel's high-water mark);
    without a client, this process's (its threads are the workers)."""
    return client.run(_max_rss) if client is not None else {"this-process": _max_rss()}


def print_summary(summary: dict) -> None:
    """A few lines a person reads at the end of a run."""
    out = {
        "status": summary["status"],
        "run_dir": summary["run_dir"],
        "timings_s": summary["timings_s"],
        "metrics": summary["metrics"],
    }
    if summary.get("rounds"):
        out["rounds"] = summary["rounds"]
    print(json.dumps(out, indent=2, default=str))


def describe_plan(plan: Plan) -> str:
    """The plan table and a one-line verdict."""
    verdict = "fits" if plan.fits else f"needs a limit of {format_bytes(plan.needed_limit_bytes)}"
    return f"{plan.table()}\nverdict: {verdict}"
