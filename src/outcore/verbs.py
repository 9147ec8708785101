"""The contract every command family implements, and the options every command shares.

A family's ``cli`` module (named in ``outcore.families``) lists its ``VERBS``: each ``Verb``
adds its arguments to a parser and turns the parsed arguments into a ``Job`` (checking its
inputs lazily, before anything starts); ``runner.run_job`` runs it. A verb may carry a
``Tunable`` (how ``outcore tune`` drives its chunk option) and the module a ``DEMO`` stage
(a small run of the family inside ``outcore demo``). This module sits below the families and
above the core (plan, runs, cluster); nothing here imports a family except ``load_verbs``,
which imports the one asked for.
"""

from __future__ import annotations

import argparse
import importlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dask.utils import format_bytes, parse_bytes

from outcore import backend, cluster
from outcore.checks import path_component, positive, size, writable_directory
from outcore.errors import OutcoreError
from outcore.families import FAMILIES, Family
from outcore.plan import (
    WORKER_BASELINE_BYTES,
    Plan,
    Resources,
    least_memory_limit,
    worker_memory_limit,
)

if TYPE_CHECKING:
    import distributed

    from outcore.runs import Run


#: ``rounds(client, plan, outputs)`` of a ``Job``: readies its compute-only round, returns it.
Rounds = Callable[["distributed.Client", Plan, Mapping[str, Path]], Callable[[], Any]]


@dataclass
class Job:
    """One command's work, as plain functions that share nothing but their arguments.

    ``plan(resources)`` builds the memory plan (no compute) for the running cluster's
    ``Resources``; whatever it chose to fit them (blocks, tiles, a projector) rides in the
    plan's ``choices``, and the config entries of those choices in its ``config``. The runner
    plans once and hands that plan to ``execute(run, client, plan)``, which computes and
    writes the outputs into ``run.path``, declaring them with ``run.add_output`` and recording
    metrics. ``inputs`` are hashed into the summary; ``data_bytes`` is what the job reads and
    writes, which ``--cluster auto`` weighs to run a small job in-process. ``plan_fixes`` and
    ``device_fixes`` are the changes that shrink the host or device memory of the plan, named
    when it does not fit. ``rounds(client, plan, outputs)``, when given, readies the
    compute-only round that ``--warmup-rounds`` / ``--measure-rounds`` and ``outcore tune``
    repeat and returns it as a function of no arguments; ``outputs`` are the partial paths
    of what ``execute`` wrote, by name (empty under ``outcore tune``, which runs no
    ``execute``). ``worker_baseline_bytes`` is what one of its workers holds before any task
    (the baseline its plans count): a ``--memory-limit`` too small for it is refused before
    any cluster starts.
    """

    command: str
    config: dict[str, Any]
    plan: Callable[[Resources], Plan]
    execute: Callable[[Run, distributed.Client, Plan], None]
    inputs: Sequence[str | Path] = field(default_factory=list)
    plan_fixes: Sequence[str] = ()
    rounds: Rounds | None = None
    device_fixes: Sequence[str] = ()
    data_bytes: int = 0
    worker_baseline_bytes: int = WORKER_BASELINE_BYTES


@dataclass(frozen=True)
class Tunable:
    """How ``outcore tune`` drives one verb.

    ``option``: the verb's chunk-size argument (its argparse dest). ``work(args)``: the work
    of one round, in ``work_units``; throughput is work / median seconds, in ``units``.
    ``build(verb, args, resources, scratch)`` makes the job of one point (default: the
    verb's own ``make_job``); ``stage(args, scratch)`` writes what the job's rounds read,
    inside the cluster, before the clock starts. ``arguments(parser)`` adds or changes options of
    ``outcore tune VERB`` (after the verb's own).
    """

    option: str
    units: str
    work_units: str
    work: Callable[[argparse.Namespace], float]
    build: Callable[[Verb, argparse.Namespace, Resources, Path], Job] | None = None
    stage: Callable[[argparse.Namespace, Path], None] | None = None
    arguments: Callable[[argparse.ArgumentParser], None] | None = None


@dataclass(frozen=True)
class Verb:
    """A job-running subcommand: its arguments and how it becomes a ``Job``.

    ``make_job(args, resources)`` checks the arguments and the inputs' metadata (nothing is
    computed) and returns the job; ``resources`` are what the common options describe
    (``Resources.of_options``: workers, threads, the memory limit, the resolved backend),
    before any cluster starts, for the choices a job must make before its plan (the blocks
    of a raw read); the plan itself is made for the running cluster's.

    ``defaults`` are parser defaults of the common options (e.g. ``{"cluster": "local"}``);
    ``fill_defaults(args)`` sets defaults that depend on other options (e.g. the workers of
    a local cluster); ``tunable`` lets ``outcore tune`` drive it.
    """

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    make_job: Callable[[argparse.Namespace, Resources], Job]
    defaults: dict | None = None
    fill_defaults: Callable[[argparse.Namespace], None] | None = None
    tunable: Tunable | None = None


@dataclass(frozen=True)
class DemoStage:
    """A family's part of ``outcore demo``: ``run(run, client, size)`` runs a small job of the
    family of ``size`` (0 skips it) on the demo's cluster, checks it against its truth and
    records its metrics; ``option`` (e.g. ``--tomo-size``) sets the size."""

    option: str
    default: int
    help: str
    run: Callable[[Run, distributed.Client, int], None]


# --- the families -----------------------------------------------------------------------------


def family_of(command: str) -> Family | None:
    """The family whose command is ``command`` (the first word of a verb), or None."""
    return next((f for f in FAMILIES if f.command == command), None)


def load_verbs(family: Family) -> dict[str, Verb]:
    """The verbs of ``family`` by name (imports its ``cli`` module)."""
    module = importlib.import_module(family.cli)
    return {verb.name: verb for verb in module.VERBS}


def all_verbs() -> dict[str, Verb]:
    """Every verb of every family (imports them all)."""
    return {name: verb for family in FAMILIES for name, verb in load_verbs(family).items()}


def demo_stages() -> list[DemoStage]:
    """The demo stages the families declare (``DEMO`` in their ``cli`` modules), in order."""
    stages = []
    for family in FAMILIES:
        stage = getattr(importlib.import_module(family.cli), "DEMO", None)
        if stage is not None:
            stages.append(stage)
    return stages


# --- the common options -----------------------------------------------------------------------


class Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line with a fix, like outcore's own
    errors (exit code 2)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}. Fix: see {self.prog} --help.\n")



def add_common_options(parser: argparse.ArgumentParser, defaults: dict | None = None) -> None:
    """The options every job command takes (DESIGN.md: cluster, memory, backend, run dir)."""
    g = parser.add_argument_group("cluster and run options")
    g.add_argument("--cluster", default="auto",
                   help="auto, local, threads, cuda, mpi, or a scheduler address")
    g.add_argument("--workers", type=int, default=None, help="number of workers (one per GPU)")
    g.add_argument("--threads-per-worker", type=int, default=1)
    g.add_argument("--memory-limit", default=None, help="host memory per worker, e.g. 4GiB")
    g.add_argument("--device-memory-limit", default=None,
                   help="GPU memory per worker: the plan's device budget, and where dask-cuda"
                        " starts spilling to host (default: the GPU's free memory)")
    g.add_argument("--spill-dir", default=None, help="where workers spill to disk")
    g.add_argument("--dashboard-address", default=cluster.LOOPBACK_DASHBOARD,
                   help="host:port of the dashboard (default loopback, random port)")
    g.add_argument("--interface", default=None, help="network interface for mpi (e.g. ib0, lo)")
    g.add_argument("--tls-cert", default=None, help="TLS certificate (PEM) for every component")
    g.add_argument("--tls-key", default=None, help="private key of --tls-cert (PEM)")
    g.add_argument("--tls-ca", default=None, help="CA certificate that signed --tls-cert (PEM)")
    g.add_argument("--backend", default="auto", choices=backend.BACKENDS)
    g.add_argument("--output-dir", default="runs", help="parent folder of run directories")
    g.add_argument("--name", default=None, help="run directory name (default: command-time)")
    g.add_argument("--warmup-rounds", type=int, default=0)
    g.add_argument("--measure-rounds", type=int, default=1)
    g.add_argument("--worker-timeout", type=float, default=None,
                   help="seconds one task may run before the run is ended as failed")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    g.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                   help="print the traceback of an error (for a bug report)")
    if defaults:
        parser.set_defaults(**defaults)


def add_checkpoint_options(parser: argparse.ArgumentParser, command: str, every: int,
                           applies: str = "") -> None:
    """``--checkpoint-every``, ``--resume`` and ``--resume-from`` of an iterative verb
    (``applies``: a prefix for the help, e.g. ``"sirt/cgls: "``)."""
    parser.add_argument("--checkpoint-every", type=int, default=every,
                        help=f"{applies}iterations between checkpoints in work/")
    parser.add_argument("--resume", action="store_true",
                        help=f"{applies}go on from the newest checkpoint of --resume-from")
    parser.add_argument("--resume-from", default=None, metavar="RUN_DIR",
                        help=f"run directory of an earlier {command} (its work/ is reused)")


def check_resume(args: argparse.Namespace) -> None:
    """Refuse ``--resume`` without ``--resume-from`` and the other way round."""
    if args.resume != (args.resume_from is not None):
        raise OutcoreError("--resume and --resume-from go together.",
                           "give both: --resume --resume-from RUN_DIR (the earlier run).")


@dataclass(frozen=True)
class RunSettings:
    """The common options of every command (see ``add_common_options``)."""

    cluster: cluster.ClusterOptions
    backend: str = "auto"
    output_dir: str = "runs"
    name: str | None = None
    warmup_rounds: int = 0
    measure_rounds: int = 1
    progress: bool = True
    worker_timeout: float | None = None

    def to_record(self) -> dict[str, Any]:
        """The settings as the effective config records them."""
        return {
            "cluster": vars(self.cluster),
            "backend": self.backend,
            "output_dir": str(self.output_dir),
            "name": self.name,
            "warmup_rounds": self.warmup_rounds,
            "measure_rounds": self.measure_rounds,
            "worker_timeout": self.worker_timeout,
        }

    def validate(self) -> None:
        """Refuse a run name, round counts, timeouts and folders that cannot work, before
        anything starts: ``--output-dir`` and ``--spill-dir`` must be (or be creatable as)
        writable directories."""
        if self.name is not None:
            path_component(self.name, "--name")
        writable_directory(self.output_dir, "--output-dir")
        if self.cluster.spill_dir is not None:
            writable_directory(self.cluster.spill_dir, "--spill-dir")
        positive(self.worker_timeout, "--worker-timeout",
                 "the seconds one task may run, e.g. --worker-timeout 600")
        if self.warmup_rounds < 0 or self.measure_rounds < 1:
            raise OutcoreError(
                f"--warmup-rounds {self.warmup_rounds} / --measure-rounds {self.measure_rounds}"
                " cannot be run.",
                "give --warmup-rounds 0 or more and --measure-rounds 1 or more.",
            )


    def check_memory_limit(self, baseline_bytes: int = WORKER_BASELINE_BYTES) -> None:
        """Refuse a ``--memory-limit`` under ``plan.least_memory_limit(baseline_bytes)`` (what
        a worker holds before any task, inside its budget), naming the least that works."""
        given = self.cluster.memory_limit
        if given is None or self.cluster.is_address:
            return
        limit = worker_memory_limit(size(given, "--memory-limit"),
                                    self.cluster.threads_per_worker)
        least = least_memory_limit(baseline_bytes)
        if limit is not None and limit < least:
            raise OutcoreError(
                f"--memory-limit {given} gives each worker {format_bytes(limit)}, less than"
                f" the {format_bytes(least)} a worker needs before any task (about"
                f" {format_bytes(baseline_bytes)} resident, within the"
                " 60 % of its limit a plan may use).",
                f"give --memory-limit {math.ceil(least / 2**20)}MiB or more.")

    def memory_limit_note(self, resources: Resources) -> str | None:
        """A note when the workers got less memory than the size ``--memory-limit`` asked
        (dask caps a limit above the machine's memory at that memory); None otherwise."""
        given = self.cluster.memory_limit
        if (given in (None, "auto") or self.cluster.is_address
                or resources.memory_limit is None):
            return None
        try:
            asked = float(given)
        except (TypeError, ValueError):
            asked = float(parse_bytes(given))
        if asked <= 1 or resources.memory_limit >= asked:  # a fraction, or what was asked
            return None
        return (f"--memory-limit {given} is more than this machine's memory: each worker got"
                f" {format_bytes(resources.memory_limit)}, and the plan is made for that")


def cluster_options(args: argparse.Namespace) -> cluster.ClusterOptions:
    """The cluster options of parsed common options."""
    return cluster.ClusterOptions(
        kind=args.cluster,
        workers=args.workers,
        threads_per_worker=args.threads_per_worker,
        memory_limit=args.memory_limit,
        device_memory_limit=args.device_memory_limit,
        spill_dir=args.spill_dir,
        dashboard_address=args.dashboard_address,
        interface=args.interface,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        tls_ca=args.tls_ca,
    )


def run_settings(args: argparse.Namespace) -> RunSettings:
    """The run settings of parsed common options."""
    return RunSettings(
        cluster=cluster_options(args),
        backend=args.backend,
        output_dir=args.output_dir,
        name=args.name,
        warmup_rounds=args.warmup_rounds,
        measure_rounds=args.measure_rounds,
        progress=not args.no_progress,
        worker_timeout=args.worker_timeout,
    )
