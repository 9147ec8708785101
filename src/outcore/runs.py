"""Run directories: a self-describing record of one command's run.

A run directory holds ``summary.json`` (schema version, command, status, the process that
runs it, timings, cluster placement, versions, effective config, inputs and outputs with
sizes and SHA-256, metrics, whether Dask's performance report was written and why),
``effective-config.yaml``, the outputs, and ``dask-report.html`` when it was written. It is
created empty and refused when it exists.

Each output is written under a partial name (``NAME.partial-<token>``, handed out by
``add_output``) and renamed to its own name only after ``status: success`` was written, once
every output was found, checked and hashed; so no output stands under its own name unless
the run succeeded, whenever the process is killed. ``summary.json`` says ``status: running``
while the run goes on and ``failed`` (with the reason; the partial outputs stay) when the
run raised. ``check_run`` (``outcore runs``) marks a ``running`` run whose process is gone as
``interrupted``, and finishes the renames of a run killed between its success and them.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import hashlib
import json
import os
import platform
import shutil
import socket
import statistics
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from outcore.checks import choice, existing_path, path_component
from outcore.errors import (
    InputNotFoundError,
    OutcoreError,
    RunExistsError,
    partial_path,
    refuse_existing,
)

SCHEMA_VERSION = 2
SUMMARY = "summary.json"
CONFIG = "effective-config.yaml"
REPORT = "dask-report.html"
#: When ``Run.performance_report`` writes Dask's report: ``auto`` (a job of at least
#: ``REPORT_AFTER_S`` seconds), ``always`` or ``never``.
REPORT_CHOICES = ("auto", "always", "never")
#: Seconds of work from which ``auto`` writes the report: its 0.7 s is then 7 % or less.
REPORT_AFTER_S = 10.0
_HASH_BLOCK = 8 * 2**20
_VERSIONED = (
    "outcore", "numpy", "scipy", "dask", "distributed", "xarray", "zarr", "pandas",
    "cupy-cuda12x", "cupy-cuda13x", "dask-cuda", "dask-mpi", "mpi4py", "h5py", "tifffile",
    "astropy", "numba",
)


def versions() -> dict[str, str]:
    """Versions of Python and of the installed packages outcore uses."""
    out = {"python": platform.python_version()}
    for name in _VERSIONED:
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[name] = metadata.version(name)
    return out


def sha256_path(path: str | Path, stop: threading.Event | None = None) -> str:
    """SHA-256 of a file, or of a directory tree (relative names and contents, sorted).
    ``stop``, once set, ends the hashing with ``InterruptedError`` at the next block."""
    path = Path(path)
    digest = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for file in files:
        if file != path:
            digest.update(file.relative_to(path).as_posix().encode() + b"\0")
        with open(file, "rb") as fh:
            while block := fh.read(_HASH_BLOCK):
                if stop is not None and stop.is_set():
                    raise InterruptedError(f"hashing {path} was stopped")
                digest.update(block)
    return digest.hexdigest()


def input_record(path: str | Path, role: str = "input") -> dict[str, Any]:
    """An input's entry in ``summary.json``: role, absolute path and bytes, with ``sha256``
    None until its hash is taken (``sha256_path``)."""
    path = Path(path)
    return {"role": role, "path": str(path.resolve()), "bytes": size_of(path), "sha256": None}


def size_of(path: str | Path) -> int:
    """Bytes of a file, or of all files under a directory."""
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


#: errno of a full disk, a quota or a file size limit.
_NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def _write_json_atomic(path: Path, record: dict) -> None:
    """Write ``record`` as JSON through ``PATH.tmp`` and ``os.replace``. On a full disk, the
    record is rewritten in place instead, compact (and without its traceback if that makes
    it fit), into the blocks the file already holds, so a failed run can still say so."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        tmp.write_text(json.dumps(record, indent=2, sort_keys=False, default=str) + "\n")
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        if err.errno not in _NO_ROOM or not path.is_file():
            raise
        room = path.stat().st_size
        shorter = {k: v for k, v in record.items() if k != "traceback"}
        texts = [json.dumps(r, separators=(",", ":"), default=str).encode()
                 for r in (record, shorter)]
        fitting = [t for t in texts if len(t) <= room]
        if not fitting:  # a longer record could be cut off half written: keep the old one
            raise
        with open(path, "r+b") as fh:
            fh.write(fitting[0])
            fh.truncate()


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


# --- the process that runs a run --------------------------------------------------------------


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """State letter and start time (clock ticks after boot) of a process, from Linux's
    ``/proc/PID/stat``; None where there is none."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return fields[0], int(fields[19])


def process_age_s() -> float:
    """Seconds since this process started (Linux: its start after boot, to the clock tick);
    0.0 where the system does not say."""
    stat = _proc_stat(os.getpid())
    boot_clock = getattr(time, "CLOCK_BOOTTIME", None)
    if stat is None or boot_clock is None:
        return 0.0
    return max(time.clock_gettime(boot_clock) - stat[1] / os.sysconf("SC_CLK_TCK"), 0.0)


def _boot_id() -> str | None:
    with contextlib.suppress(OSError):
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    return None


def process_record(pid: int | None = None) -> dict[str, Any]:
    """The host and PID of a process (this one by default), with its start time and the
    machine's boot id where Linux gives them: enough to tell later whether it still runs."""
    pid = os.getpid() if pid is None else pid
    stat = _proc_stat(pid)
    return {"host": socket.gethostname(), "pid": pid,
            "start_ticks": stat[1] if stat else None, "boot_id": _boot_id()}


def process_alive(process: dict[str, Any] | None) -> bool | None:
    """Whether the process of ``process_record`` still runs: False once it has ended (no such
    PID, a zombie, another process under its PID, or the machine rebooted), None when this
    machine cannot tell (another host, or no record)."""
    if not process or process.get("host") != socket.gethostname():
        return None
    if process.get("boot_id") and _boot_id() not in (None, process["boot_id"]):
        return False
    try:
        os.kill(int(process["pid"]), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    stat = _proc_stat(int(process["pid"]))
    if stat is not None and (stat[0] in "ZX" or process.get("start_ticks") not in (None,
                                                                                      stat[1])):
        return False
    return True


# --- a run ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Output:
    final: Path
    partial: Path
    verify: Callable[[Path], None] | None

    def pending(self) -> dict[str, Any]:
        """The summary's entry of an output not (or not yet) complete."""
        return {"name": self.final.name, "path": str(self.partial),
                "final_path": str(self.final), "partial": True}


class Run:
    """One run directory. Create with ``Run.create``; end with ``finish`` or ``fail``."""

    def __init__(self, path: Path, command: str, config: dict[str, Any]) -> None:
        self.path = path
        self.command = command
        self.config = config
        self.started = time.perf_counter()
        #: The partial names of this run's outputs end in ``.partial-<token>``.
        self.token = uuid.uuid4().hex[:12]
        self.record: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "command": command,
            "run_dir": str(path.resolve()),
            "argv": sys.argv,
            "process": process_record(),
            "status": "running",
            "started_at": _now(),
            "finished_at": None,
            "timings_s": {},
            "rounds": None,
            "report": None,
            "cluster": None,
            "plan": None,
            "versions": versions(),
            "config": config,
            "inputs": [],
            "outputs": [],
            "metrics": {},
        }
        self._outputs: list[_Output] = []

    @classmethod
    def create(
        cls, output_dir: str | Path, name: str | None, command: str, config: dict[str, Any]
    ) -> Run:
        """Make ``output_dir/name`` (default name: command and UTC time); refuse one that
        exists, and a name that is not one plain path component."""
        name = path_component(name, "name") if name is not None else \
            f"{command}-{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%S}"
        path = refuse_existing(Path(output_dir) / name)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            path.mkdir()
        except FileExistsError as err:  # raced with another run of the same name
            raise RunExistsError(f"{path} already exists.", "choose another name=.") from err
        run = cls(path, command, config)
        (path / CONFIG).write_text(yaml.safe_dump(config, sort_keys=True))
        run._write()
        return run

    def _write(self) -> None:
        _write_json_atomic(self.path / SUMMARY, self.record)

    def add_input(self, path: str | Path, role: str = "input", sha256: str | None = None) -> None:
        """Record an input's size and SHA-256; with ``sha256`` given, refuse a mismatch."""
        record = {**input_record(path, role), "sha256": sha256_path(path)}
        if sha256 is not None and record["sha256"] != sha256.lower():
            raise OutcoreError(
                f"{path} has SHA-256 {record['sha256']}, not the {sha256} it was expected to "
                "have.",
                "check that the right input is given, or update the expected hash.",
            )
        self.record_inputs([record])

    def record_inputs(self, records: list[dict[str, Any]]) -> None:
        """Add inputs' entries (``input_record``) to the summary."""
        self.record["inputs"].extend(records)
        self._write()

    def add_output(
        self, name: str | Path, verify: Callable[[Path], None] | None = None
    ) -> Path:
        """Declare an output (a name inside the run directory, or an absolute path) and return
        the partial path to write it to: ``NAME.partial-<token>`` beside it, which ``finish``
        renames to ``NAME`` after the success is recorded (so a figure is saved with its
        format named, ``savefig(path, format="png")``). An existing ``NAME`` is refused.

        ``verify(path)`` raises if the output on disk is bad; ``finish`` calls it on the
        partial path.
        """
        final = refuse_existing((self.path / name).absolute())
        output = _Output(final, partial_path(final, self.token), verify)
        self._outputs.append(output)
        self.record["outputs"].append(output.pending())
        self._write()
        return output.partial

    def outputs(self) -> dict[str, Path]:
        """The partial path of each declared output, by its name (``stack.zarr``)."""
        return {o.final.name: o.partial for o in self._outputs}

    @contextlib.contextmanager
    def timing(self, stage: str) -> Iterator[None]:
        """Record the wall time of a stage in seconds under ``timings_s[stage]``."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.record["timings_s"][stage] = round(time.perf_counter() - t0, 6)

    @contextlib.contextmanager
    def performance_report(self, when: str = "auto", cluster: bool = True) -> Iterator[None]:
        """Dask's performance report of the enclosed work, written to ``dask-report.html``
        ``always``, ``never``, or (``auto``) when the work took ``REPORT_AFTER_S`` seconds
        or more: rendering it imports bokeh and costs about 0.7 s, more than a short job.

        What the report shows is collected from the start either way (the scheduler's task
        stream and profiles: cheap); whether it is written is decided when the work ends,
        from its measured seconds, and recorded under ``report`` in the summary (``path``:
        the file or None, ``when``, ``why``), with ``timings_s.report`` the seconds it
        took. When the work raised, the report is written if the rule asks for one and it
        can be, and never hides that error.

        The report's "calling code" is the command line (``argv``): dask would otherwise
        look up the source of this function, 0.3 s of ``inspect`` over every loaded module.
        ``cluster=False``: the work runs on dask's threaded scheduler, which keeps nothing to
        report (``always`` then cannot be honoured: OutcoreError).
        """
        choice(when, REPORT_CHOICES, "report")
        if when == "never" or not cluster:
            if when == "always":
                raise OutcoreError("Dask's performance report needs a Dask cluster, and this"
                                   " work runs on dask's threaded scheduler.",
                                   "run it on a Dask cluster, or do not ask for a report.")
            self.record["report"] = {"path": None, "when": when, "why": (
                "not asked for" if when == "never" else
                "the work ran on dask's threaded scheduler, which keeps no report")}
            yield
            return
        from distributed import get_client, performance_report

        report = performance_report(filename=str(self.path / REPORT))
        report.__enter__()
        code = " ".join(map(str, self.record["argv"]))
        t0 = time.perf_counter()

        def finish(*exc: Any) -> None:
            seconds = time.perf_counter() - t0
            wanted = when == "always" or seconds >= REPORT_AFTER_S
            why = ("asked for" if when == "always" else
                   f"the work took {seconds:.1f} s, {'at least' if wanted else 'under'}"
                   f" the {REPORT_AFTER_S:g} s after which one is written")
            self.record["report"] = {"path": str(self.path / REPORT) if wanted else None,
                                     "when": when, "why": why}
            if wanted:
                with self.timing("report"):
                    get_client().sync(report.__aexit__, *exc, code=code)

        try:
            yield
        except BaseException as err:
            with contextlib.suppress(Exception):
                finish(type(err), err, err.__traceback__)
            raise
        finish(None, None, None)

    def set(self, key: str, value: Any) -> None:
        """Store a top-level field (cluster, plan, ...) of the summary."""
        self.record[key] = value
        self._write()

    def metric(self, **values: Any) -> None:
        """Add metrics (numbers, short dicts) to the summary."""
        self.record["metrics"].update(values)
        self._write()

    def rounds(self, work: Callable[[], Any], warmup: int = 0, measure: int = 1) -> Any:
        """Run ``work`` warmup + measure times in the same cluster; record the measured walls.

        Returns the last round's result. min/median/max of the measured rounds go to
        ``rounds`` in the summary.
        """
        if warmup < 0 or measure < 1:
            raise OutcoreError(
                f"rounds need warmup >= 0 and measure >= 1 (got {warmup}, {measure}).",
                "pass warmup_rounds=0 or more and measure_rounds=1 or more.",
            )
        result = None
        walls = []
        for index in range(warmup + measure):
            t0 = time.perf_counter()
            result = work()
            if index >= warmup:
                walls.append(time.perf_counter() - t0)
        self.record["rounds"] = {
            "warmup": warmup,
            "measure": measure,
            "wall_s": [round(w, 6) for w in walls],
            "min_s": min(walls),
            "median_s": statistics.median(walls),
            "max_s": max(walls),
        }
        self._write()
        return result

    def finish(self) -> dict[str, Any]:
        """Check every declared output on disk (under its partial name), hash it, write
        ``status: success``, then rename each output to its own name.

        The success is the commit point: until the renames are done the summary lists them
        under ``committing``, so that ``check_run`` can finish them after a kill; a rename
        that fails undoes the others and the error propagates (the run then fails).
        """
        t0 = time.perf_counter()
        outputs = []
        for out in self._outputs:
            if not out.partial.exists():
                raise OutcoreError(f"output {out.final.name} was not written.",
                                   "see the log above.")
            if out.verify is not None:
                out.verify(out.partial)
            refuse_existing(out.final)
            outputs.append(
                {"name": out.final.name, "path": str(out.final), "bytes": size_of(out.partial),
                 "sha256": sha256_path(out.partial)}
            )
        self.record["outputs"] = outputs
        self.record["timings_s"]["verify_outputs"] = round(time.perf_counter() - t0, 6)
        self._end_timings()
        self.record["finished_at"] = _now()
        self.record["status"] = "success"
        self.record["committing"] = [{"from": str(o.partial), "to": str(o.final)}
                                     for o in self._outputs]
        self._write()
        renamed: list[_Output] = []
        try:
            for out in self._outputs:
                refuse_existing(out.final)
                out.partial.rename(out.final)
                renamed.append(out)
        except BaseException:
            for out in reversed(renamed):
                out.final.rename(out.partial)
            raise
        del self.record["committing"]
        self._write()
        return self.record

    def fail(self, error: BaseException) -> dict[str, Any]:
        """Write ``status: failed`` with the reason; the outputs written so far stay under
        their partial names and are listed with ``partial: true``."""
        self.record.pop("committing", None)
        self.record["status"] = "failed"
        self.record["reason"] = f"{type(error).__name__}: {error}"
        self.record["traceback"] = traceback.format_exception(error)[-5:]
        self.record["outputs"] = [out.pending() for out in self._outputs if out.partial.exists()]
        self._end_timings()
        self.record["finished_at"] = _now()
        self._write()
        return self.record

    def _end_timings(self) -> None:
        """``timings_s.total`` (since the run directory was made) and ``process`` (since the
        process started: what the process spent before the run directory and in it)."""
        self.record["timings_s"]["total"] = round(time.perf_counter() - self.started, 6)
        self.record["timings_s"]["process"] = round(process_age_s(), 6)


def load_summary(run_dir: str | Path) -> dict[str, Any]:
    """The summary.json of a run directory as a dict."""
    return json.loads((Path(run_dir) / SUMMARY).read_text())


def check_run(run_dir: str | Path) -> dict[str, Any]:
    """The summary of ``run_dir``, brought up to date with its process (nothing is deleted).

    A ``running`` run whose process is gone (``process_alive`` is False) becomes
    ``interrupted``, recording when and why, and lists the partial outputs still on disk. A
    ``success`` whose process was killed before its outputs were all renamed gets the renames
    finished (every output was checked and hashed before the success was written). Other
    runs, and runs whose process this machine cannot see, are returned as they are.
    """
    path = Path(run_dir)
    record = load_summary(path)
    status = record.get("status")
    if status not in ("running", "success") or (status == "success"
                                                and "committing" not in record):
        return record
    if process_alive(record.get("process")) is not False:
        return record
    process = record["process"]
    if status == "success":
        for move in record.pop("committing"):
            source, target = Path(move["from"]), Path(move["to"])
            if source.exists() and not target.exists():
                source.rename(target)
        record["commit_completed_at"] = _now()
    else:
        why = (f"its process {process['pid']} on {process['host']} ended without recording an"
               " end: it was killed (SIGKILL, the out-of-memory killer) or its machine stopped")
        record["status"] = "interrupted"
        record["interrupted"] = {"detected_at": _now(), "why": why}
        record["reason"] = f"interrupted: {why}."
        record["outputs"] = [o for o in record.get("outputs", [])
                             if o.get("partial") and Path(o["path"]).exists()]
    _write_json_atomic(path / SUMMARY, record)
    return record


def run_directories(parent: str | Path) -> list[Path]:
    """The run directories under ``parent`` (those holding a summary.json), by name;
    ``parent`` itself when it is one."""
    parent = existing_path(parent, "folder of runs")
    if not parent.is_dir():
        raise InputNotFoundError(f"{str(parent)!r} is not a folder of run directories.",
                                 "give the output_dir= of the runs (default runs), or one run"
                                 " directory.")
    if (parent / SUMMARY).is_file():
        return [parent]
    return sorted(p for p in parent.iterdir() if (p / SUMMARY).is_file())


def resumed_run(run_dir: str | Path, command: str) -> tuple[Path, dict[str, Any]]:
    """The directory and summary of an earlier run of ``command`` named by ``--resume-from``
    (an interrupted run is recorded as such first, ``check_run``); OutcoreError when it is
    missing, not a run directory, a run of another command, or still running here."""
    path = existing_path(run_dir, "run directory of resume_from=").resolve()
    fix = f"point resume_from= at the run directory of an earlier outcore {command}."
    if not (path / SUMMARY).is_file():
        raise InputNotFoundError(f"{str(path)!r} has no {SUMMARY}: not a run directory.", fix)
    record = check_run(path)
    if record.get("command") != command:
        raise OutcoreError(f"{str(path)!r} is a run of {record.get('command')!r}, not of "
                           f"{command}.", fix)
    if record.get("status") == "running" and process_alive(record.get("process")):
        raise OutcoreError(f"{str(path)!r} is still running (process "
                           f"{record['process']['pid']}).", "wait until it ends, or stop it"
                           " first (kill PID); then resume from it.")
    return path, record


def link_tree(source: Path, target: Path) -> None:
    """Copy the directory ``source`` to ``target`` with hard links where the filesystem has
    them (for a resumed run's work directory: the solvers replace files, never write into
    them, so the earlier run stays whole)."""

    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(source, target, copy_function=link)


def check_png(path: Path) -> None:
    """Refuse an output that is not a PNG image (the verify step of a figure)."""
    with open(path, "rb") as fh:
        if fh.read(8) != b"\x89PNG\r\n\x1a\n":
            raise OutcoreError(f"{path.name} is not a PNG image.", "run the command again.")
