"""Run directories: refused when they exist, self-describing, status written last."""

from __future__ import annotations

import hashlib
import json

import pytest
import yaml

from outcore.errors import OutcoreError, RunExistsError
from outcore.runs import Run, load_summary, resumed_run, sha256_path


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
    assert summary["status"] == "success" and summary["schema_version"] == 1
    assert summary["inputs"][0]["sha256"] == hashlib.sha256(b"x" * 1000).hexdigest()
    assert summary["inputs"][0]["bytes"] == 1000
    assert summary["outputs"][0]["sha256"] == hashlib.sha256(b"hello").hexdigest()
    assert summary["metrics"]["answer"] == 42 and "stage" in summary["timings_s"]
    assert summary["versions"]["dask"]


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
