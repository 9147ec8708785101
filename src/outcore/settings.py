"""The options every command shares, as the command line parses them, and the run settings
they make: ``Parser`` (usage errors in one line with a fix), ``add_common_options`` (cluster,
memory, backend, run directory), ``add_checkpoint_options`` and ``check_resume`` (iterative
verbs), ``RunSettings`` (validated before anything starts) and ``run_settings`` /
``cluster_options`` (from parsed arguments). The runner reads ``RunSettings``; the families'
verbs add these options to their parsers. This module is the CLI's: its messages name flags.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dask.utils import format_bytes, parse_bytes

from outcore import backend, cluster
from outcore.checks import path_component, positive, size, writable_directory
from outcore.errors import OutcoreError, translate
from outcore.plan import WORKER_BASELINE_BYTES, Resources, least_memory_limit, worker_memory_limit
from outcore.runs import REPORT_AFTER_S, REPORT_CHOICES

__all__ = [
    "Parser",
    "RunSettings",
    "add_checkpoint_options",
    "add_common_options",
    "check_resume",
    "cluster_options",
    "flags_of",
    "in_flags",
    "run_settings",
]

#: Keywords of the Python functions whose flag is not their name with dashes (used where the
#: parser has that flag).
KEYWORD_FLAGS = {"kind": "--cluster", "attrs": "--attr", "arrays": "--array"}

#: A keyword as errors name it: ``name=``, ``name=value``, ``name='text'``, ``name=(1, 2)``,
#: ``name={'key': value}``.
_KEYWORD = re.compile(r"(?<![\w.\-])([a-z][a-z0-9_]*)="
                      r"(\{[^}]*\}|'[^']*'|\"[^\"]*\"|\([^)]*\)|[^\s,;)]*)")
_PAIR = re.compile(r"""['"]([^'"]+)['"]\s*:\s*('[^']*'|"[^"]*"|[^,}]+)""")


def flags_of(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Keyword -> flag for ``parser``'s options: each option's ``dest`` -> its first long
    option string (``memory_limit`` -> ``--memory-limit``), and those of ``KEYWORD_FLAGS``
    whose flag it has."""
    flags = {}
    for action in parser._actions:
        longs = [o for o in action.option_strings if o.startswith("--")]
        if longs and action.dest != "help":
            flags[action.dest] = longs[0]
    given = set(flags.values())
    return {k: f for k, f in KEYWORD_FLAGS.items() if f in given} | flags


def in_flags(error: BaseException, flags: Mapping[str, str]) -> BaseException:
    """``error`` as the command line reports it: a user's error (``errors.translate``) with
    each keyword of ``flags`` that its problem or fix names written as its flag
    (``memory_limit='2GiB'`` -> ``--memory-limit 2GiB``, ``block=`` -> ``--block``,
    ``aligned=True`` -> ``--aligned``, ``attrs={'energy': 12658}`` -> ``--attr
    energy=12658``); anything else as it is."""
    user = translate(error)
    if user is None:
        return error
    problem, fix = (_flag_words(text, flags) for text in (user.problem, user.fix))
    if (problem, fix) == (user.problem, user.fix):
        return user
    rewritten = type(user)(problem, fix)
    rewritten.__cause__ = error
    return rewritten


def _flag_words(text: str, flags: Mapping[str, str]) -> str:
    def swap(match: re.Match[str]) -> str:
        flag = flags.get(match.group(1))
        if flag is None:
            return match.group(0)
        value, tail = match.group(2), ""
        if value.endswith(".") and not value.startswith(("'", '"')):
            value, tail = value[:-1], "."
        if value.startswith("{"):
            pairs = [f"{flag} {k}={v.strip(chr(39) + chr(34) + ' ')}"
                     for k, v in _PAIR.findall(value)]
            return " ".join(pairs or [flag]) + tail
        if value == "True":  # a switch: aligned=True -> --aligned
            return flag + tail
        if value[:1] in ("'", '"'):
            value = value[1:-1]
        elif value.startswith("("):
            value = " ".join(v.strip() for v in value[1:-1].split(",") if v.strip())
        return (f"{flag} {value}" if value else flag) + tail

    return _KEYWORD.sub(swap, text)


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
    g.add_argument("--dashboard", action="store_true",
                   help="serve Dask's dashboard for workers that are threads of this process"
                        " too (--cluster threads, or auto's choice of it); worker processes"
                        " always serve one")
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
    g.add_argument("--report", default="auto", choices=REPORT_CHOICES,
                   help="write Dask's performance report dask-report.html: always, never, or"
                        f" auto: when the job ran {REPORT_AFTER_S:g} s or more (summary.json"
                        " records which and why)")
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
    #: when to write Dask's performance report: ``auto``, ``always`` or ``never``
    #: (``runs.Run.performance_report``).
    report: str = "auto"
    #: keyword -> flag of the verb's parser (``flags_of``): the run's errors name flags.
    flags: Mapping[str, str] | None = None

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
            "report": self.report,
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
        dashboard=args.dashboard,
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
        report=args.report,
        flags=getattr(args, "flags", None),
    )
