"""Run directories: refused when they exist, self-describing, status written last."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from outcore.errors import OutcoreError, RunExistsError
from outcore.runs import (
    Run,
    check_run,
    load_summary,
    process_alive,
    process_record,
    resumed_run,
    run_directories,
    sha256_path,
)


def test_run_records_inputs_outputs_and_success_last(tmp_path):
    source = tmp_path / "input.bin"
    source.write_bytes(b"x" * 1000)
    run = Run.create(tmp_path / "runs", "r1", "demo", {"alpha": 1})
    assert load_summary(run.path)["status"] == "running"
    assert yaml.safe_load((run.path / "effective-config.yaml").read_text()) == {"alpha": 1}
    run.add_input(source)
    out = run.add_output("result.txt", verify=lambda p: None)
    out.write_text("hello")
    with run.timing("stage"):
        pass
    run.metric(answer=42)
    run.finish()
    summary = json.loads((run.path / "summary.json").read_text())
    assert summary["status"] == "success" and summary["schema_version"] == 2
    assert summary["inputs"][0]["sha256"] == hashlib.sha256(b"x" * 1000).hexdigest()
    assert summary["inputs"][0]["bytes"] == 1000
    assert summary["outputs"][0]["sha256"] == hashlib.sha256(b"hello").hexdigest()
    assert summary["metrics"]["answer"] == 42 and "stage" in summary["timings_s"]
    assert summary["versions"]["dask"]


@pytest.mark.parametrize("name", ["../escape", "/tmp/abs", "", "a/b", ".", ".."])
def test_a_run_name_must_be_one_plain_path_component(tmp_path, name):
    with pytest.raises(OutcoreError, match="is not a plain name"):
        Run.create(tmp_path / "runs", name, "demo", {})
    assert not (tmp_path / "runs").exists() and list(tmp_path.iterdir()) == []


def test_existing_run_directory_is_refused_and_untouched(tmp_path):
    (tmp_path / "r1").mkdir()
    (tmp_path / "r1" / "keep.txt").write_text("mine")
    with pytest.raises(RunExistsError, match="never overwrites"):
        Run.create(tmp_path, "r1", "demo", {})
    assert [p.name for p in (tmp_path / "r1").iterdir()] == ["keep.txt"]


def test_missing_or_bad_output_fails_the_finish(tmp_path):
    run = Run.create(tmp_path, "r", "demo", {})
    run.add_output("never-written.zarr")
    with pytest.raises(OutcoreError, match="was not written"):
        run.finish()
    run.fail(RuntimeError("boom"))
    summary = load_summary(run.path)
    assert summary["status"] == "failed" and "boom" in summary["reason"]


def test_input_hash_mismatch_is_refused(tmp_path):
    source = tmp_path / "a.bin"
    source.write_bytes(b"abc")
    run = Run.create(tmp_path, "r", "demo", {})
    with pytest.raises(OutcoreError, match="SHA-256"):
        run.add_input(source, sha256="0" * 64)


def test_directory_hash_depends_on_names_and_contents(tmp_path):
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "x").write_bytes(b"1")
    assert sha256_path(tmp_path / "a") == sha256_path(tmp_path / "b")
    (tmp_path / "b" / "x").write_bytes(b"2")
    assert sha256_path(tmp_path / "a") != sha256_path(tmp_path / "b")


def test_rounds_record_min_median_max(tmp_path):
    run = Run.create(tmp_path, "r", "demo", {})
    calls = []
    assert run.rounds(lambda: calls.append(1) or len(calls), warmup=2, measure=3) == 5
    rounds = load_summary(run.path)["rounds"]
    assert len(rounds["wall_s"]) == 3 and rounds["min_s"] <= rounds["median_s"] <= rounds["max_s"]
    with pytest.raises(OutcoreError):
        run.rounds(lambda: None, warmup=0, measure=0)


def test_resumed_run_is_checked_before_use(tmp_path):
    run = Run.create(tmp_path, "r", "tomo reconstruct", {"method": "cgls"})
    run.finish()
    path, record = resumed_run(tmp_path / "r", "tomo reconstruct")
    assert path == (tmp_path / "r").resolve() and record["config"]["method"] == "cgls"
    with pytest.raises(OutcoreError, match="is a run of 'tomo reconstruct', not of ptycho"):
        resumed_run(tmp_path / "r", "ptycho reconstruct")
    (tmp_path / "empty").mkdir()
    with pytest.raises(OutcoreError, match="has no summary.json: not a run directory"):
        resumed_run(tmp_path / "empty", "tomo reconstruct")
    with pytest.raises(OutcoreError, match="does not exist"):
        resumed_run(tmp_path / "missing", "tomo reconstruct")


def _dead_process() -> dict:
    """The process record of a process that has ended (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    record = process_record(child.pid)
    child.wait()
    return record


def test_outputs_stay_partial_until_the_success_is_recorded(tmp_path):
    run = Run.create(tmp_path, "r", "demo", {})
    out = run.add_output("result.txt", verify=lambda p: None)
    assert out.parent == run.path and out.name == f"result.txt.partial-{run.token}"
    out.write_text("hello")
    listed = load_summary(run.path)["outputs"]
    assert listed == [{"name": "result.txt", "path": str(out),
                       "final_path": str(run.path / "result.txt"), "partial": True}]
    assert not (run.path / "result.txt").exists()
    run.finish()
    assert (run.path / "result.txt").read_text() == "hello" and not out.exists()
    summary = load_summary(run.path)
    assert summary["status"] == "success" and "committing" not in summary
    assert summary["outputs"][0]["path"] == str(run.path / "result.txt")


def test_a_failed_run_keeps_its_outputs_under_their_partial_names(tmp_path):
    run = Run.create(tmp_path, "r", "demo", {})
    written = run.add_output("a.zarr")
    written.mkdir()
    run.add_output("never.zarr")
    run.fail(RuntimeError("boom"))
    summary = load_summary(run.path)
    assert summary["status"] == "failed"
    assert [o["path"] for o in summary["outputs"]] == [str(written)]
    assert written.is_dir() and not (run.path / "a.zarr").exists()


def test_the_process_of_a_run_is_recorded_and_checked(tmp_path):
    here = load_summary(Run.create(tmp_path, "r", "demo", {}).path)["process"]
    assert here["pid"] == os.getpid() and here["host"] == socket.gethostname()
    assert process_alive(here) is True
    assert process_alive(_dead_process()) is False
    assert process_alive({**here, "start_ticks": here["start_ticks"] + 1}) is False  # PID reused
    assert process_alive({**here, "host": "elsewhere"}) is None


def test_a_run_whose_process_is_gone_is_recorded_as_interrupted(tmp_path):
    run = Run.create(tmp_path, "r", "fit-dipoles", {})
    partial = run.add_output("fits.zarr")
    partial.mkdir()
    run.add_output("fits.parquet")
    run.set("process", _dead_process())
    record = check_run(run.path)
    assert record == load_summary(run.path) and record["status"] == "interrupted"
    assert "was killed" in record["reason"] and record["interrupted"]["detected_at"]
    assert [o["path"] for o in record["outputs"]] == [str(partial)]
    assert partial.is_dir() and not (run.path / "fits.zarr").exists()  # nothing deleted or named
    alive = Run.create(tmp_path, "alive", "fit-dipoles", {})
    assert check_run(alive.path)["status"] == "running"
    with pytest.raises(OutcoreError, match="is still running"):
        resumed_run(alive.path, "fit-dipoles")


def test_the_renames_of_a_success_cut_short_are_finished(tmp_path):
    """A kill between the success and the last rename: the outputs were verified and hashed,
    so check_run finishes the renames (and only for a process that has ended)."""
    run = Run.create(tmp_path, "r", "demo", {})
    first, second = run.add_output("a.txt"), run.add_output("b.txt")
    first.write_text("a")
    second.write_text("b")
    run.finish()
    (run.path / "b.txt").rename(second)  # as if killed after the first rename
    record = load_summary(run.path)
    record["committing"] = [{"from": str(p), "to": str(run.path / n)}
                            for p, n in ((first, "a.txt"), (second, "b.txt"))]
    record["process"] = _dead_process()
    (run.path / "summary.json").write_text(json.dumps(record))
    done = check_run(run.path)
    assert done["status"] == "success" and "committing" not in done
    assert (run.path / "b.txt").read_text() == "b" and not second.exists()
    assert [p.name for p in run_directories(tmp_path)] == ["r"]


def test_a_full_disk_still_records_the_failure_in_place(tmp_path, monkeypatch):
    """When the summary cannot go through its temporary file (no space left), it is
    rewritten in place, compact, if it fits in the bytes the file holds; else the old one
    stays whole and the error propagates."""
    run = Run.create(tmp_path, "r", "demo", {"padding": "x" * 2000})
    real_write = Path.write_text

    def no_room(self: Path, text: str) -> int:
        if self.suffix == ".tmp":
            real_write(self, text[:10])  # a partial temporary file, to be removed
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return real_write(self, text)

    monkeypatch.setattr(Path, "write_text", no_room)
    run.fail(RuntimeError("boom"))
    summary = load_summary(run.path)
    assert summary["status"] == "failed" and "boom" in summary["reason"]
    assert not (run.path / "summary.json.tmp").exists()
    run.record["metrics"] = {"long": "y" * 10_000}
    with pytest.raises(OSError, match="No space left"):
        run.fail(RuntimeError("again"))
    assert load_summary(run.path)["reason"] == "RuntimeError: boom"
