"""outcore: out-of-core imaging data on Dask, from a laptop to many GPUs.

The ``outcore`` command: the parser tree and ``main``. The commands come from the family
list (``outcore.families``); a family's module is imported only when one of its verbs is
chosen, so ``outcore --help`` and ``outcore info`` import no family. A verb that runs a job
gives ``make_job(args, resources) -> Job`` (``outcore.verbs``); the same function serves
``outcore plan VERB ...``, which prints the memory plan without starting anything.

Every error a user can cause ends in one line on stderr, ``outcore VERB: error: PROBLEM
Fix: WHAT TO DO``, and exit code 1 (2 for a usage error of the parser); an unexpected
exception, a bug, in one line saying so. ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import atexit
import json
import logging
import os
import sys
from collections.abc import Sequence

from dask.utils import format_bytes

from outcore import __version__, backend, cluster, runs
from outcore.errors import OutcoreError, translate
from outcore.families import FAMILIES
from outcore.plan import Resources
from outcore.settings import (
    Parser,
    add_common_options,
    cluster_options,
    flags_of,
    in_flags,
    run_settings,
)
from outcore.verbs import Verb, family_of, load_verbs

#: Commands of the core that are not families: they take no common options.
CORE_COMMANDS = {
    "info": "versions, devices and backends",
    "plan": "print the memory plan of a command without running it",
    "tune": "time a command over chunk sizes and worker counts",
    "runs": "list run directories with their status (marks interrupted runs as such)",
    "warm": "compile the kernels into numba's cache and outcore into bytecode, once after"
            " installing (make does it), so that no command compiles them",
}


def _info(args: argparse.Namespace) -> int:
    record = {
        "outcore": __version__,
        "versions": runs.versions(),
        "cpus": os.cpu_count(),
        "host_memory": {k.removesuffix("_bytes"): format_bytes(v)
                        for k, v in backend.host_memory().items()},
        "backends": ["numpy"] + (["cupy"] if backend.gpu_available() else []),
        "auto_backend": backend.resolve("auto"),
        "auto_cluster": cluster.ClusterOptions().resolved_kind(),
        "gpus": backend.devices(),
    }
    print(json.dumps(record, indent=2))
    return 0


def _warm(args: argparse.Namespace) -> int:
    """``outcore warm``: outcore's modules compiled to bytecode (an editable install has
    none until a first import writes them) and every family's ``warm`` functions run, which
    compile its numba kernels into numba's on-disk cache, or load them where they are there
    already. A command then loads them, the first one after installing included."""
    import compileall
    import importlib
    import time

    t0 = time.perf_counter()
    package = os.path.dirname(os.path.abspath(__file__))
    compiled = compileall.compile_dir(package, quiet=1, workers=0)
    print(f"bytecode: {package} ({'compiled' if compiled else 'some modules failed'})",
          flush=True)
    for family in FAMILIES:
        for name in family.warm:
            t1 = time.perf_counter()
            module, _, function = name.partition(":")
            getattr(importlib.import_module(module), function)()
            print(f"kernels: {family.command}: {name} ({time.perf_counter() - t1:.1f} s)",
                  flush=True)
    print(f"warm in {time.perf_counter() - t0:.1f} s", flush=True)
    return 0 if compiled else 1


def _verb_named(words: Sequence[str]) -> tuple[Verb, list[str]]:
    """The verb the first one or two ``words`` name (``fit-dipoles``, ``tomo simulate``)
    and the words after it; OutcoreError naming the commands when none matches."""
    family = family_of(words[0]) if words else None
    if family is None:
        commands = ", ".join(f.command for f in FAMILIES)
        raise OutcoreError(f"{' '.join(words[:1]) or 'nothing'!r} is not a command with a"
                           " plan.", f"use one of: {commands}.")
    verbs = load_verbs(family)
    if words[0] in verbs:
        return verbs[words[0]], list(words[1:])
    name = " ".join(words[:2])
    if name not in verbs:
        raise OutcoreError(f"{name!r} is not a command with a plan.",
                           f"use one of: {', '.join(sorted(verbs))}.")
    return verbs[name], list(words[2:])


def _plan(args: argparse.Namespace) -> int:
    """``outcore plan VERB ...``: the plan for the cluster the options describe, nothing
    started. ``--backend cupy`` plans for GPU workers even on a machine without one (give
    ``--device-memory-limit`` for their device memory)."""
    verb, rest = _verb_named([args.verb, *args.rest])
    parser = Parser(prog=f"outcore plan {verb.name}")
    verb.add_arguments(parser)
    add_common_options(parser, verb.defaults)
    args.flags = flags_of(parser)
    vargs = parser.parse_args(rest)
    if verb.fill_defaults:
        verb.fill_defaults(vargs)
    run_settings(vargs).validate()
    opts = cluster_options(vargs)
    opts.validate(on_this_machine=False)
    with backend.planning_only():
        resources = Resources.of_options(opts, backend.resolve(vargs.backend))
        plan = verb.make_job(vargs, resources).plan(resources)
    from outcore.runner import describe_plan

    print(describe_plan(plan))
    return 0 if plan.fits else 1


def _add_family(sub: argparse._SubParsersAction, command: str, help_text: str,
                verbs: dict[str, Verb] | None) -> None:
    """The subparser of one family; with ``verbs`` its full tree, else its name alone."""
    one_word = verbs is not None and command in verbs
    if one_word:
        verb = verbs[command]  # type: ignore[index]
        p = sub.add_parser(command, help=help_text, description=verb.help,
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter)
        _add_verb(p, verb)
        return
    group = sub.add_parser(command, help=help_text, description=help_text)
    if verbs is None:
        return
    children = group.add_subparsers(dest="subcommand", required=True)
    for verb in verbs.values():
        p = children.add_parser(verb.name.partition(" ")[2], help=verb.help,
                                description=verb.help,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
        _add_verb(p, verb)


def _add_verb(p: argparse.ArgumentParser, verb: Verb) -> None:
    p.set_defaults(verb=verb)
    verb.add_arguments(p)
    add_common_options(p, verb.defaults)
    p.set_defaults(flags=flags_of(p))  # the keywords its errors name, as its flags


def build_parser(chosen: str | None = None) -> argparse.ArgumentParser:
    """The ``outcore`` parser; only the family of the command ``chosen`` gets its verbs
    (the others are listed by name and help, their modules not imported)."""
    parser = Parser(prog="outcore", description=__doc__.splitlines()[0],
                    formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--version", action="version", version=f"outcore {__version__}")
    parser.add_argument("--debug", action="store_true",
                        help="print the traceback of an error (for a bug report)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help=CORE_COMMANDS["info"])
    sub.add_parser("warm", help=CORE_COMMANDS["warm"], description=_warm.__doc__.split("\n\n")[0]
                   .replace("``", ""))
    plan = sub.add_parser("plan", help=CORE_COMMANDS["plan"])
    plan.add_argument("verb", help=f"a command: {', '.join(f.command for f in FAMILIES)}")
    plan.add_argument("rest", nargs=argparse.REMAINDER)
    tune = sub.add_parser("tune", help=CORE_COMMANDS["tune"],
                          description="Time VERB over --chunk-size values and --workers"
                                      " counts; see `outcore tune VERB -h` for every option"
                                      " and docs/tune.md.")
    tune.add_argument("verb", help="the command to tune (a two-word command in quotes or as"
                                   " two words)")
    tune.add_argument("rest", nargs=argparse.REMAINDER,
                      help="--chunk-size ..., --workers ..., the verb's own and common options")
    listing = sub.add_parser("runs", help=CORE_COMMANDS["runs"],
                             description="List the run directories under DIR with their"
                                         " status. A running run whose process has ended"
                                         " (killed) is recorded as interrupted; nothing is"
                                         " deleted.")
    listing.add_argument("dir", nargs="?", default="runs",
                         help="a folder of run directories (--output-dir), or one run directory")
    listing.add_argument("--json", action="store_true", help="one JSON object per run")
    for family in FAMILIES:
        verbs = load_verbs(family) if family.command == chosen else None
        _add_family(sub, family.command, family.help, verbs)
    return parser


def _runs(args: argparse.Namespace) -> int:
    """``outcore runs [DIR]``: one line (or JSON object) per run directory, each brought up
    to date with ``runs.check_run``."""
    rows = []
    for path in runs.run_directories(args.dir):
        try:
            record = runs.check_run(path)
        except (OSError, ValueError) as err:  # a summary.json that cannot be read
            record = {"status": "unreadable", "reason": f"{type(err).__name__}: {err}"}
        process = record.get("process") or {}
        note = record.get("reason") or ""
        if record.get("status") == "running":
            alive = runs.process_alive(process)
            note = (f"process {process.get('pid')} on {process.get('host')}"
                    + ("" if alive else " (cannot be checked from this host)"))
        rows.append({"run_dir": str(path.resolve()), "name": path.name,
                     "status": record.get("status"), "command": record.get("command"),
                     "started_at": record.get("started_at"),
                     "finished_at": record.get("finished_at"), "note": note,
                     "process": process or None})
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return 0
    print(f"{'run':<32} {'status':<12} {'command':<20} {'started (UTC)':<26} note")
    for row in rows:
        note = " ".join(row["note"].split())
        print(f"{row['name']:<32} {row['status']:<12} {row['command'] or '?':<20}"
              f" {row['started_at'] or '?':<26} {note[:100]}")
    return 0


def error_line(name: str, error: BaseException, flags: dict[str, str] | None = None) -> str:
    """The one line that reports ``error`` of ``outcore NAME``: a user's error with its fix
    (the keywords it names written as the verb's ``flags``), or an unexpected exception said
    to be a bug, with how to see its traceback."""
    user = translate(in_flags(error, flags or {}))
    if user is not None:
        text = f"outcore {name}: error: {user}"
    else:
        text = (f"outcore {name}: internal error (a bug in outcore): {type(error).__name__}:"
                f" {error} Fix: run the command again with --debug to see the traceback,"
                " and report it with that output.")
    return " ".join(text.split())


def _command_word(argv: Sequence[str]) -> str | None:
    """The first word of ``argv`` that is not an option: the command."""
    return next((word for word in argv if not word.startswith("-")), None)


def main(argv: Sequence[str] | None = None) -> int:
    # distributed logs every connection at INFO, on every MPI rank; keep warnings and errors
    logging.getLogger("distributed").setLevel(os.environ.get("OUTCORE_LOG_LEVEL", "WARNING"))
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(_command_word(argv)).parse_args(argv)
    try:
        if args.command == "info":
            return _info(args)
        if args.command == "plan":
            return _plan(args)
        if args.command == "runs":
            return _runs(args)
        if args.command == "warm":
            return _warm(args)
        if args.command == "tune":
            from outcore import tune

            return tune.run_cli(args)
        from outcore.runner import print_summary, run_job

        verb: Verb = args.verb
        if verb.fill_defaults:
            verb.fill_defaults(args)
        summary = run_job(run_settings(args), lambda r: verb.make_job(args, r))
        print_summary(summary)
        return 0
    except BrokenPipeError:
        return reader_gone()
    except (Exception, KeyboardInterrupt) as err:
        if args.debug:
            raise
        name = args.verb.name if isinstance(getattr(args, "verb", None), Verb) else args.command
        if isinstance(err, KeyboardInterrupt):
            print(f"outcore {name}: interrupted (Ctrl-C); a run that had started is recorded"
                  " as failed.", file=sys.stderr)
            return 130
        print(error_line(name, err, getattr(args, "flags", None)), file=sys.stderr)
        return 1


#: The exit code of a command whose output's reader went away (128 + SIGPIPE, as a shell
#: tool killed by that signal reports it).
BROKEN_PIPE_EXIT = 141


def reader_gone() -> int:
    """End quietly when the reader of stdout has gone (``outcore runs | head``): stdout is
    pointed at /dev/null, so that what is still buffered, and the interpreter's last flush,
    go nowhere instead of raising ``BrokenPipeError`` again; returns ``BROKEN_PIPE_EXIT``."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (AttributeError, OSError, ValueError):  # a stdout without a file (captured)
        pass
    return BROKEN_PIPE_EXIT


def entry() -> None:
    """The ``outcore`` command: ``main``, then the exit handlers (logging, MPI, dask's
    clean-ups) and an exit that skips the interpreter's teardown of every loaded module,
    which costs 0.3-1 s of CPU once dask, zarr and numba are loaded and saves nothing: the
    outputs and the summary are on disk by then. An MPI rank exits the usual way, through
    the interpreter's teardown, where mpi4py finalizes MPI (mpirun kills the job's other
    ranks when one leaves unfinalized)."""
    code = main()
    try:
        sys.stdout.flush()
    except BrokenPipeError:  # the reader left before the last of the output was written
        code = reader_gone()
    if "mpi4py.MPI" in sys.modules:
        sys.exit(code)
    sys.stderr.flush()
    atexit._run_exitfuncs()
    os._exit(code)


if __name__ == "__main__":
    entry()
