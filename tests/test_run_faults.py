"""Faults under load, for each operator family: the client killed outright, and a full disk.

(A killed *worker* is covered where each family's answer is checked against a clean run:
tests/test_fit_streaming.py, test_tomo_faults.py, test_ptycho_engine.py and, for the demo's
stores, test_out_of_core.py.)

Killed client: ``outcore VERB`` runs as a subprocess on a threads cluster and gets SIGKILL
while it writes; until then a watcher samples the run's files and checks that no output ever
stands under its final name while the run's status is not ``success``. Afterwards the outputs
are still under their partial names, ``outcore runs`` lists the run as ``interrupted`` (and
records that in its summary), and the iterative verbs resume from it.

Full disk: the run directory (and any output) sits on a tmpfs of a few MiB, mounted in a
user and mount namespace of its own (``unshare``; skipped where that is not allowed). The
run ends ``failed`` with "No space left on the device" in one line and in its summary, and no
output is under its final name.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
import pytest

import outcore
from outcore.cli import main
from outcore.fit import simulate_catalog
from outcore.ptycho import preprocess, save_preprocessed, simulate
from outcore.runs import load_summary
from outcore.tomo import Projector, shepp_logan
from outcore.tomo.geometry import scan_for
from outcore.tomo.layouts import projections_dataset

from .ptycho_cases import local_client

THREADS = ["--cluster", "threads", "--no-progress"]
ENV = {**os.environ, "PYTHONPATH": str(Path(outcore.__file__).parents[1])}
DEMO = ["demo", "--scan", "32", "64", "--frame", "64", "--fit-candidates", "0",
        "--tomo-size", "0", "--ptycho-scan", "0", "--memory-limit", "4GiB"]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    """A catalog, a projections store, a preprocessed ptychography store, an HDF5 volume."""
    d = tmp_path_factory.mktemp("fault-inputs")
    catalog, _ = simulate_catalog(4000, stamp=15, seed=2, chunk_size=500)
    np.savez(d / "cat.npz", images=catalog["images"].values,
             candidate_id=catalog["candidate_id"].values)
    shape = (16, 16, 16)
    geometry = scan_for("parallel", shape, 24)
    projections = Projector(geometry, shape, "views").project(shepp_logan(shape))
    outcore.save(projections_dataset(projections, geometry, shape, "shepp-logan"),
                 d / "proj.zarr", layout="projections")
    with local_client() as client:
        stack, _ = simulate((8, 8), detector=16, step=3, seed=0).save(d / "stack.zarr")
        save_preprocessed(preprocess(stack, client=client), d / "pre.zarr")
    with h5py.File(d / "vol.h5", "w") as f:
        f["volume"] = np.random.default_rng(0).random((64, 64, 64), dtype=np.float32)
    return d


# --- killed client ----------------------------------------------------------------------------


class Watched:
    """``outcore ARGV`` as a subprocess, its stdout collected line by line, and a watcher
    that samples every summary.json under ``runs`` (about every 5 ms) for an output that
    stands under its final name while the run has not succeeded."""

    def __init__(self, argv: list[str], runs: Path) -> None:
        self.runs = runs
        self.lines: list[str] = []
        self.violations: list[str] = []
        self.samples = 0
        runs.mkdir(parents=True)
        self.stderr = runs.parent / "stderr.txt"
        with open(self.stderr, "w") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "outcore.cli", *argv], env=ENV,
                                         stdout=subprocess.PIPE, stderr=err, text=True)
        threading.Thread(target=self._read, daemon=True).start()
        self._watcher = threading.Thread(target=self._watch, daemon=True)
        self._watcher.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)

    def _watch(self) -> None:
        while self.proc.poll() is None:
            for summary in self.runs.glob("*/summary.json"):
                record = json.loads(summary.read_text())
                for out in record.get("outputs", []):
                    final = Path(out.get("final_path") or out["path"])
                    if record["status"] != "success" and final.exists():
                        self.violations.append(f"{final} exists, status {record['status']}")
            self.samples += 1
            time.sleep(0.005)

    def kill_when(self, ready: Callable[[], bool], timeout: float = 240) -> None:
        """SIGKILL the process once ``ready()`` holds (it must hold before the run ends)."""
        deadline = time.monotonic() + timeout
        while not ready():
            assert self.proc.poll() is None, f"the run ended first: {self.stderr.read_text()}"
            assert time.monotonic() < deadline, "the run never got there"
            time.sleep(0.01)
        self.proc.send_signal(signal.SIGKILL)
        assert self.proc.wait(30) == -signal.SIGKILL
        self._watcher.join()

    def said(self, words: str) -> bool:
        return any(words in line for line in self.lines)


def _written(run: Path, pattern: str) -> Callable[[], bool]:
    """True once a partial store matching ``pattern`` has begun: its metadata is written,
    and no more than that need be (its chunks follow)."""
    return lambda: any(run.glob(f"{pattern}/zarr.json"))


def _interrupted(runs: Path, name: str, capsys) -> dict:
    """The listing of ``outcore runs`` for ``name`` (which records the interruption)."""
    assert main(["runs", str(runs), "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    row = next(r for r in rows if r["name"] == name)
    summary = load_summary(runs / name)
    assert row["status"] == summary["status"] == "interrupted"
    assert "was killed" in summary["reason"] and summary["interrupted"]["detected_at"]
    return summary


def _only_partial(summary: dict, final_names: list[Path]) -> None:
    """No output under its final name; the outputs listed are partial and on disk."""
    assert not [p for p in final_names if p.exists()]
    assert all(o["partial"] and Path(o["path"]).exists() for o in summary["outputs"])


def test_killed_fit_leaves_partial_fits_and_an_interrupted_run(inputs, tmp_path, capsys):
    runs, run = tmp_path / "runs", tmp_path / "runs" / "fit"
    watched = Watched(["fit-dipoles", "--input", str(inputs / "cat.npz"), "--chunk-size",
                       "250", *THREADS, "--output-dir", str(runs), "--name", "fit"], runs)
    watched.kill_when(_written(run, "fits.zarr.partial-*"))
    assert not watched.violations and watched.samples > 10
    summary = _interrupted(runs, "fit", capsys)
    _only_partial(summary, [run / "fits.zarr", run / "fits.parquet"])
    assert [o["name"] for o in summary["outputs"]] == ["fits.zarr"]


def test_killed_demo_leaves_its_stack_partial(tmp_path, capsys):
    runs, run = tmp_path / "runs", tmp_path / "runs" / "demo"
    watched = Watched([*DEMO, *THREADS, "--output-dir", str(runs), "--name", "demo"], runs)
    watched.kill_when(_written(run, "stack.zarr.partial-*.partial-*"))
    assert not watched.violations
    summary = _interrupted(runs, "demo", capsys)
    _only_partial(summary, [run / "stack.zarr", run / "statistics.zarr"])
    assert list(run.glob("stack.zarr.partial-*.partial-*"))  # the store's own partial stays


def test_killed_tomo_reconstruct_resumes_to_the_uninterrupted_volume(inputs, tmp_path, capsys):
    runs = tmp_path / "runs"
    argv = ["tomo", "reconstruct", "--input", str(inputs / "proj.zarr"), "--method", "sirt",
            "--iterations", "4", "--checkpoint-every", "1", *THREADS, "--output-dir", str(runs)]
    watched = Watched([*argv, "--name", "killed"], runs)
    watched.kill_when(lambda: watched.said("iteration 2:"))
    assert not watched.violations
    _only_partial(_interrupted(runs, "killed", capsys), [runs / "killed" / "volume.zarr"])
    assert main([*argv, "--name", "resumed", "--resume", "--resume-from",
                 str(runs / "killed")]) == 0
    assert main([*argv, "--name", "clean"]) == 0
    resumed, clean = (load_summary(runs / name) for name in ("resumed", "clean"))
    assert resumed["metrics"]["resumed_from_iteration"] >= 2
    assert resumed["metrics"]["residuals"] == clean["metrics"]["residuals"]
    volumes = [outcore.open(runs / name / "volume.zarr")["volume"].values
               for name in ("resumed", "clean")]
    np.testing.assert_array_equal(*volumes)


def test_killed_ptycho_reconstruct_resumes(inputs, tmp_path, capsys):
    runs = tmp_path / "runs"
    argv = ["ptycho", "reconstruct", "--input", str(inputs / "pre.zarr"), "--iterations", "10",
            "--batch-size", "16", "--checkpoint-every", "1", *THREADS, "--output-dir",
            str(runs)]
    watched = Watched([*argv, "--name", "killed"], runs)
    watched.kill_when(lambda: watched.said("iteration 3/10"))
    assert not watched.violations
    summary = _interrupted(runs, "killed", capsys)
    assert not (runs / "killed" / "reconstruction.zarr").exists() and not summary["outputs"]
    assert main([*argv, "--name", "resumed", "--resume", "--resume-from",
                 str(runs / "killed")]) == 0
    resumed = load_summary(runs / "resumed")
    assert resumed["status"] == "success" and resumed["config"]["resumed_at_iteration"] >= 2
    assert (runs / "resumed" / "reconstruction.zarr").is_dir()


# --- full disk --------------------------------------------------------------------------------


def _tmpfs_allowed() -> bool:
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
                            "d=$(mktemp -d) && mount -t tmpfs -o size=1m tmpfs $d"],
                           capture_output=True)
    return probe.returncode == 0


needs_tmpfs = pytest.mark.skipif(
    not _tmpfs_allowed(), reason="cannot mount a tmpfs in a user namespace here (unshare)")


def _on_full_disk(tmp_path: Path, size: str, argv: list[str]) -> tuple[int, str, Path]:
    """Run ``outcore ARGV`` with ``{disk}`` in its words standing for a fresh tmpfs of
    ``size``; return the exit code, stderr and a copy of what the disk held at the end."""
    disk, kept = tmp_path / "disk", tmp_path / "kept"
    disk.mkdir()
    words = " ".join(shlex.quote(w.replace("{disk}", str(disk)))
                     for w in [sys.executable, "-m", "outcore.cli", *argv])
    script = (f"mount -t tmpfs -o size={size} tmpfs {disk} || exit 99; {words}; rc=$?; "
              f"cp -a {disk} {kept}; exit $rc")
    done = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
                           script], env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode != 99, done.stderr
    return done.returncode, done.stderr, kept


@needs_tmpfs
@pytest.mark.parametrize(("name", "size", "argv", "outputs"), [
    ("fit", "1m", ["fit-dipoles", "--input", "{inputs}/cat.npz", "--chunk-size", "250"],
     ["runs/r/fits.zarr", "runs/r/fits.parquet"]),
    ("tomo", "256k", ["tomo", "simulate", "--shape", "48", "48", "48", "--views", "72",
                      "--output", "{disk}/proj.zarr"], ["proj.zarr"]),
    ("ptycho", "1m", ["ptycho", "simulate", "--scan", "16", "16", "--detector", "64",
                      "--output", "{disk}/stack.zarr"], ["stack.zarr", "stack.truth.zarr"]),
    ("convert", "512k", ["convert", "{inputs}/vol.h5", "{disk}/vol.zarr", "--layout", "volume",
                         "--attr", "voxel_size=1"], ["vol.zarr"]),
])
def test_a_full_disk_fails_the_run_in_one_line(inputs, tmp_path, name, size, argv, outputs):
    argv = [w.replace("{inputs}", str(inputs)) for w in argv]
    code, stderr, kept = _on_full_disk(tmp_path, size, [*argv, *THREADS, "--output-dir",
                                                        "{disk}/runs", "--name", "r"])
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert code == 1 and len(lines) == 1, stderr
    assert "No space left on the device" in lines[0] and "Fix:" in lines[0]
    summary = load_summary(kept / "runs" / "r")
    assert summary["status"] == "failed" and "No space left" in summary["reason"]
    assert not [out for out in outputs if (kept / out).exists()]
