"""Run directories: a self-describing record of one command's run.

A run directory holds ``summary.json`` (schema version, command, status, timings, cluster
placement, versions, effective config, inputs and outputs with sizes and SHA-256, metrics),
``effective-config.yaml``, the outputs, and ``dask-report.html``. It is created empty and
refused when it exists. ``summary.json`` says ``status: running`` while the run goes on;
``success`` is written last, after every output was found and hashed on disk, and
``failed`` (with the reason) when the run raised.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import os
import platform
import shutil
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from outcore.checks import existing_path
from outcore.errors import InputNotFoundError, OutcoreError, RunExistsError, refuse_existing

SCHEMA_VERSION = 1
SUMMARY = "summary.json"
CONFIG = "effective-config.yaml"
REPORT = "dask-report.html"
_HASH_BLOCK = 8 * 2**20
_VERSIONED = (
    "outcore", "numpy", "scipy", "dask", "distributed", "xarray", "zarr", "pandas",
    "cupy-cuda12x", "dask-cuda", "dask-mpi", "mpi4py", "h5py", "tifffile", "astropy",
)


def versions() -> dict[str, str]:
    """Versions of Python and of the installed packages outcore uses."""
    out = {"python": platform.python_version()}
    for name in _VERSIONED:
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[name] = metadata.version(name)
    return out


def sha256_path(path: str | Path) -> str:
    """SHA-256 of a file, or of a directory tree (relative names and contents, sorted)."""
    path = Path(path)
    digest = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for file in files:
        if file != path:
            digest.update(file.relative_to(path).as_posix().encode() + b"\0")
        with open(file, "rb") as fh:
            while block := fh.read(_HASH_BLOCK):
                digest.update(block)
    return digest.hexdigest()


def size_of(path: str | Path) -> int:
    """Bytes of a file, or of all files under a directory."""
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _write_json_atomic(path: Path, record: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(record, indent=2, sort_keys=False, default=str) + "\n")
    os.replace(tmp, path)


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


class Run:
    """One run directory. Create with ``Run.create``; end with ``finish`` or ``fail``."""

    def __init__(self, path: Path, command: str, config: dict[str, Any]) -> None:
        self.path = path
        self.command = command
        self.config = config
        self.started = time.perf_counter()
        self.record: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "command": command,
            "run_dir": str(path.resolve()),
            "argv": sys.argv,
            "status": "running",
            "started_at": _now(),
            "finished_at": None,
            "timings_s": {},
            "rounds": None,
            "cluster": None,
            "plan": None,
            "versions": versions(),
            "config": config,
            "inputs": [],
            "outputs": [],
            "metrics": {},
        }
        self._outputs: list[tuple[Path, Callable[[Path], None] | None]] = []

    @classmethod
    def create(
        cls, output_dir: str | Path, name: str | None, command: str, config: dict[str, Any]
    ) -> Run:
        """Make ``output_dir/name`` (default name: command and UTC time); refuse one that exists."""
        name = name or f"{command}-{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%S}"
        path = refuse_existing(Path(output_dir) / name)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            path.mkdir()
        except FileExistsError as err:  # raced with another run of the same name
            raise RunExistsError(f"{path} already exists.", "choose another --name.") from err
        run = cls(path, command, config)
        (path / CONFIG).write_text(yaml.safe_dump(config, sort_keys=True))
        run._write()
        return run

    def _write(self) -> None:
        _write_json_atomic(self.path / SUMMARY, self.record)

    def add_input(self, path: str | Path, role: str = "input", sha256: str | None = None) -> None:
        """Record an input's size and SHA-256; with ``sha256`` given, refuse a mismatch."""
        path = Path(path)
        digest = sha256_path(path)
        if sha256 is not None and digest != sha256.lower():
            raise OutcoreError(
                f"{path} has SHA-256 {digest}, not the {sha256} it was expected to have.",
                "check that the right input is given, or update the expected hash.",
            )
        self.record["inputs"].append(
            {"role": role, "path": str(path.resolve()), "bytes": size_of(path), "sha256": digest}
        )
        self._write()

    def add_output(
        self, name: str | Path, verify: Callable[[Path], None] | None = None
    ) -> Path:
        """Declare an output (a name inside the run directory, or an absolute path).

        ``verify(path)`` raises if the output on disk is bad; ``finish`` calls it.
        """
        path = self.path / name
        self._outputs.append((path, verify))
        return path

    @contextlib.contextmanager
    def timing(self, stage: str) -> Iterator[None]:
        """Record the wall time of a stage in seconds under ``timings_s[stage]``."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.record["timings_s"][stage] = round(time.perf_counter() - t0, 6)

    @contextlib.contextmanager
    def performance_report(self) -> Iterator[None]:
        """Write Dask's performance report of the enclosed work to ``dask-report.html``."""
        from distributed import performance_report

        with performance_report(filename=str(self.path / REPORT)):
            yield

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
                "pass --warmup-rounds 0 or more and --measure-rounds 1 or more.",
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
        """Check every declared output on disk, hash it, and write ``status: success`` last."""
        t0 = time.perf_counter()
        outputs = []
        for path, verify in self._outputs:
            if not path.exists():
                raise OutcoreError(f"output {path.name} was not written.", "see the log above.")
            if verify is not None:
                verify(path)
            outputs.append(
                {"name": path.name, "path": str(path), "bytes": size_of(path),
                 "sha256": sha256_path(path)}
            )
        self.record["outputs"] = outputs
        self.record["timings_s"]["verify_outputs"] = round(time.perf_counter() - t0, 6)
        self.record["timings_s"]["total"] = round(time.perf_counter() - self.started, 6)
        self.record["finished_at"] = _now()
        self.record["status"] = "success"
        self._write()
        return self.record

    def fail(self, error: BaseException) -> dict[str, Any]:
        """Write ``status: failed`` with the reason; outputs already written are marked partial."""
        self.record["status"] = "failed"
        self.record["reason"] = f"{type(error).__name__}: {error}"
        self.record["traceback"] = traceback.format_exception(error)[-5:]
        self.record["outputs"] = [
            {"name": p.name, "path": str(p), "partial": True} for p, _ in self._outputs
            if p.exists()
        ]
        self.record["timings_s"]["total"] = round(time.perf_counter() - self.started, 6)
        self.record["finished_at"] = _now()
        self._write()
        return self.record


def load_summary(run_dir: str | Path) -> dict[str, Any]:
    """The summary.json of a run directory as a dict."""
    return json.loads((Path(run_dir) / SUMMARY).read_text())


def resumed_run(run_dir: str | Path, command: str) -> tuple[Path, dict[str, Any]]:
    """The directory and summary of an earlier run of ``command`` named by ``--resume-from``;
    OutcoreError when it is missing, not a run directory, or a run of another command."""
    path = existing_path(run_dir, "run directory of --resume-from").resolve()
    fix = f"point --resume-from at the run directory of an earlier outcore {command}."
    if not (path / SUMMARY).is_file():
        raise InputNotFoundError(f"{str(path)!r} has no {SUMMARY}: not a run directory.", fix)
    record = load_summary(path)
    if record.get("command") != command:
        raise OutcoreError(f"{str(path)!r} is a run of {record.get('command')!r}, not of "
                           f"{command}.", fix)
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
