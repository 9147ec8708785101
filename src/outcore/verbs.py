"""The contract every command family implements.

A family's ``cli`` module (named in ``outcore.families``) lists its ``VERBS``: each ``Verb``
adds its arguments to a parser and turns the parsed arguments into a ``Job`` (checking its
inputs lazily, before anything starts); ``runner.run_job`` runs it. A verb may carry a
``Tunable`` (how ``outcore tune`` drives its chunk option) and the module a ``DEMO`` stage
(a small run of the family inside ``outcore demo``). This module sits below the families and
above the core (plan, runs, cluster); nothing here imports a family except ``load_verbs``,
which imports the one asked for. The options every command shares, and the run settings
they make, are ``outcore.settings``'s.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from outcore.families import FAMILIES, Family
from outcore.plan import WORKER_BASELINE_BYTES, Plan, Resources

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
    any cluster starts. ``local_scheduler``: ``execute`` and ``rounds`` only compute dask
    collections (through ``outcore.progress.compute``, ``dask.compute`` or the family's
    public functions, which take ``client=None`` with a ``plan``), so that workers that are
    threads of this process can be dask's threaded scheduler, ``client`` None, without
    starting a Dask cluster (``runner.scheduler_reason``).
    """

    command: str
    config: dict[str, Any]
    plan: Callable[[Resources], Plan]
    execute: Callable[[Run, distributed.Client | None, Plan], None]
    inputs: Sequence[str | Path] = field(default_factory=list)
    plan_fixes: Sequence[str] = ()
    rounds: Rounds | None = None
    device_fixes: Sequence[str] = ()
    data_bytes: int = 0
    worker_baseline_bytes: int = WORKER_BASELINE_BYTES
    local_scheduler: bool = False


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
