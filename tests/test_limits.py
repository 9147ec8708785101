"""Nonsense limits and paths are refused before anything starts (issue 30): a memory limit
below what a worker needs, an output or spill folder that cannot be written, multi-file
inputs whose files disagree; and commands that print tables end quietly when their reader
closes the pipe."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from outcore.cli import BROKEN_PIPE_EXIT, main
from outcore.plan import least_memory_limit
from outcore.runs import Run, load_summary

OUTCORE = str(Path(sys.executable).with_name("outcore"))
#: A tiny job that starts a cluster only if nothing refuses it first.
SIMULATE = ["tomo", "simulate", "--shape", "8", "8", "8", "--views", "4", "--no-progress"]


def _refused(capsys, argv: list[str], words: str) -> str:
    """Run ``argv``; it must end with exit 1 and one error line containing ``words``, and
    no cluster line (nothing started)."""
    assert main(argv) == 1
    out, err = capsys.readouterr()
    assert "cluster:" not in out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "error:" in lines[0] and "Fix:" in lines[0], err
    assert "internal error" not in err and words in lines[0], err
    return lines[0]


def test_an_output_dir_that_is_a_file_is_refused_before_the_cluster(tmp_path, capsys):
    taken = tmp_path / "runs"
    taken.write_text("not a folder")
    line = _refused(capsys, [*SIMULATE, "--output", str(tmp_path / "p.zarr"), "--output-dir",
                             str(taken)], "--output-dir")
    assert "is a file" in line
    assert taken.read_text() == "not a folder" and not (tmp_path / "p.zarr").exists()


def test_an_output_dir_under_a_file_is_refused(tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    line = _refused(capsys, [*SIMULATE, "--output", str(tmp_path / "p.zarr"), "--output-dir",
                             str(tmp_path / "f" / "runs")], "--output-dir")
    assert "cannot be made" in line


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_output_dir_is_refused(tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        _refused(capsys, [*SIMULATE, "--output", str(tmp_path / "p.zarr"), "--output-dir",
                          str(locked / "runs")], "not writable")
    finally:
        locked.chmod(0o700)


def test_a_spill_dir_that_is_a_file_is_refused(tmp_path, capsys):
    spill = tmp_path / "spill"
    spill.write_text("x")
    _refused(capsys, [*SIMULATE, "--output", str(tmp_path / "p.zarr"), "--output-dir",
                      str(tmp_path / "runs"), "--cluster", "local", "--spill-dir", str(spill)],
             "--spill-dir")
    assert not (tmp_path / "runs").exists()


def test_tune_refuses_an_output_dir_that_is_a_file(tmp_path, capsys):
    taken = tmp_path / "runs"
    taken.write_text("x")
    assert main(["tune", "demo", "--chunk-size", "2", "--workers", "1", "--output-dir",
                 str(taken)]) == 1
    err = capsys.readouterr().err
    assert "--output-dir" in err and "internal error" not in err


def test_runs_ends_quietly_when_its_reader_closes_the_pipe(tmp_path):
    """``outcore runs DIR | head``: a closed pipe ends the listing without a word."""
    for index in range(3):
        Run.create(tmp_path, f"r{index}", "demo", {})
    read, write = os.pipe()
    os.close(read)  # the reader is gone before anything is written
    try:
        done = subprocess.run([OUTCORE, "runs", str(tmp_path)], stdout=write,
                              stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write)
    assert done.returncode == BROKEN_PIPE_EXIT
    assert done.stderr == ""


def test_a_broken_pipe_inside_main_is_quiet(tmp_path, monkeypatch, capsys):
    class Closed:
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self) -> None:
            raise BrokenPipeError(32, "Broken pipe")

    Run.create(tmp_path, "r0", "demo", {})
    monkeypatch.setattr(sys, "stdout", Closed())
    assert main(["runs", str(tmp_path)]) == BROKEN_PIPE_EXIT
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("limit", ["1B", "100MiB", "0.001"])
def test_a_memory_limit_below_a_workers_baseline_is_refused_before_any_cluster(
        tmp_path, capsys, limit):
    line = _refused(capsys, [*SIMULATE, "--output", str(tmp_path / "p.zarr"), "--output-dir",
                             str(tmp_path / "runs"), "--cluster", "local", "--memory-limit",
                             limit], "--memory-limit")
    from outcore.tomo.memory import TOMO_WORKER_BASELINE_BYTES

    # the family's least at once: a generic least first would send the user round twice
    least = least_memory_limit(TOMO_WORKER_BASELINE_BYTES)
    assert f"{math.ceil(least / 2**20)}MiB or more" in line
    assert not (tmp_path / "runs").exists()


def test_a_limit_below_the_family_s_own_baseline_is_refused_before_any_cluster(
        tmp_path, capsys):
    """A tomography worker holds numba's kernels as well (TOMO_WORKER_BASELINE_BYTES): 400 MiB
    passes the generic least but not tomography's, and is refused before the cluster, with
    tomography's least named (it was refused by the plan after the cluster had started)."""
    from outcore.tomo.memory import TOMO_WORKER_BASELINE_BYTES

    least = least_memory_limit(TOMO_WORKER_BASELINE_BYTES)
    assert least_memory_limit() < 400 * 2**20 < least
    line = _refused(capsys, [*SIMULATE, "--output", str(tmp_path / "p.zarr"), "--output-dir",
                             str(tmp_path / "runs"), "--cluster", "local", "--memory-limit",
                             "400MiB"], "--memory-limit 400MiB")
    assert f"{math.ceil(least / 2**20)}MiB or more" in line
    assert not (tmp_path / "runs").exists()


def test_a_limit_above_the_machine_s_memory_is_said_and_recorded(tmp_path):
    """dask caps a worker's limit at the machine's memory; the run says so, and the plan it
    records is made for the limit the worker got."""
    import psutil

    total = psutil.virtual_memory().total
    done = subprocess.run([OUTCORE, *SIMULATE, "--output", str(tmp_path / "p.zarr"),
                           "--output-dir", str(tmp_path / "runs"), "--name", "r", "--cluster",
                           "threads", "--workers", "1", "--memory-limit", "100000GiB"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "--memory-limit 100000GiB is more than this machine's memory" in done.stdout
    summary = load_summary(tmp_path / "runs" / "r")
    assert summary["plan"]["memory_limit_bytes"] == total
    assert [w["memory_limit_bytes"] for w in summary["cluster"]["workers"]] == [total]
    assert any("more than this machine's memory" in n for n in summary["plan"]["notes"])


@pytest.mark.parametrize(("given", "got", "noted"), [
    ("100000GiB", 2**34, True), ("16GiB", 2**34, False), ("auto", 2**34, False),
    ("0.5", 2**33, False), (str(2**35), 2**34, True), (2**30, 2**30, False)])
def test_the_note_on_a_capped_limit_compares_sizes_only(given, got, noted):
    """Only a size above what the workers got is noted: ``auto`` and fractions of the
    machine's memory are dask's own reading (``auto`` once ended a sketch in an internal
    error here)."""
    from outcore.cluster import ClusterOptions
    from outcore.plan import Resources
    from outcore.settings import RunSettings

    settings = RunSettings(ClusterOptions(kind="local", memory_limit=given))
    note = settings.memory_limit_note(Resources(2, 1, got))
    assert (note is not None) == noted
    assert note is None or f"--memory-limit {given} is more than" in note


def test_tune_refuses_a_memory_limit_below_a_workers_baseline(tmp_path, capsys):
    assert main(["tune", "demo", "--chunk-size", "2", "--workers", "1", "--memory-limit", "1B",
                 "--output-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "--memory-limit 1B" in err and "internal error" not in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kind", ["threads", "local"])
def test_the_limit_given_is_the_limit_recorded_and_planned_with(tmp_path, kind):
    """A fresh process (threads share its memory, which a test process's would fill)."""
    limit = 1024 * 2**20
    done = subprocess.run([OUTCORE, *SIMULATE, "--output", str(tmp_path / "p.zarr"),
                           "--output-dir", str(tmp_path / "runs"), "--name", "r", "--cluster",
                           kind, "--workers", "1", "--memory-limit", "1GiB"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    summary = load_summary(tmp_path / "runs" / "r")
    assert summary["plan"]["memory_limit_bytes"] == limit
    assert [w["memory_limit_bytes"] for w in summary["cluster"]["workers"]] == [limit]
    assert summary["config"]["cluster"]["memory_limit"] == "1GiB"
