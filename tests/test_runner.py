"""run_job ends runs cleanly (a cluster whose workers all stay paused fails with a reason) and
starts the cluster auto chooses for the job."""

from __future__ import annotations

import time

import dask
import dask.array as da
import pytest

from outcore import runner
from outcore.cluster import ClusterOptions
from outcore.errors import OutcoreError
from outcore.plan import Plan, Resources, TaskMemory
from outcore.progress import compute
from outcore.runs import load_summary
from outcore.verbs import Job, RunSettings


def _job() -> Job:
    def plan(resources: Resources) -> Plan:
        return Plan([TaskMemory("sum", 4, 2**20, 8)], resources.workers,
                    resources.threads_per_worker, None)

    def execute(run, client) -> None:
        compute(client, da.ones((4000, 4000), chunks=1000).sum(), show=False)

    return Job("paused", {}, plan, execute)


def test_workers_paused_for_good_end_the_run_as_failed(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "PAUSED_GRACE_S", 2.0)
    settings = RunSettings(
        ClusterOptions("local", workers=1, memory_limit="1GiB"), backend="numpy",
        output_dir=str(tmp_path), name="r", progress=False)
    # pause as soon as a worker holds 1 % of its limit: every worker pauses at once
    with dask.config.set({"distributed.worker.memory.pause": 0.01,
                          "distributed.worker.memory.spill": False,
                          "distributed.worker.memory.target": False}):
        t0 = time.perf_counter()
        with pytest.raises(OutcoreError, match="paused") as info:
            runner.run_job(settings, lambda backend: _job())
    assert time.perf_counter() - t0 < 60
    assert "--memory-limit" in info.value.fix
    summary = load_summary(tmp_path / "r")
    assert summary["status"] == "failed" and "paused" in summary["reason"]


def test_negative_rounds_are_refused_before_start(tmp_path):
    settings = RunSettings(ClusterOptions("threads"), output_dir=str(tmp_path),
                                  warmup_rounds=-1)
    with pytest.raises(OutcoreError, match="warmup-rounds"):
        runner.run_job(settings, lambda backend: _job())
    assert list(tmp_path.iterdir()) == []


def _sleepy_job() -> Job:
    def plan(resources: Resources) -> Plan:
        return Plan([TaskMemory("sleep", 1, 8, 8)], resources.workers, 1, None)

    def execute(run, client) -> None:
        compute(client, dask.delayed(time.sleep)(120), show=False)

    return Job("stuck", {}, plan, execute)


def test_worker_timeout_ends_a_stuck_task(tmp_path):
    settings = RunSettings(ClusterOptions("local", workers=1, memory_limit="400MiB"),
                                  output_dir=str(tmp_path), name="r", progress=False,
                                  worker_timeout=2.0)
    t0 = time.perf_counter()
    with pytest.raises(OutcoreError, match="--worker-timeout"):
        runner.run_job(settings, lambda backend: _sleepy_job())
    assert time.perf_counter() - t0 < 45
    summary = load_summary(tmp_path / "r")
    assert summary["status"] == "failed" and "sleep" in summary["reason"]
    with pytest.raises(OutcoreError, match="positive"):
        runner.run_job(RunSettings(ClusterOptions("threads"), worker_timeout=0),
                       lambda backend: _sleepy_job())


def _sized_job(data_bytes: int) -> Job:
    """A job whose plan says it reads ``data_bytes`` (its compute is a small sum)."""
    def plan(resources: Resources) -> Plan:
        return Plan([TaskMemory("sum", 1, 2**20, 8, read_bytes=data_bytes)],
                    resources.workers, resources.threads_per_worker, resources.memory_limit)

    def execute(run, client) -> None:
        compute(client, da.ones((1000, 1000), chunks=500).sum(), show=False)

    return Job("sized", {}, plan, execute)


def test_auto_runs_a_small_job_in_process_and_says_why(tmp_path, capsys):
    from outcore import backend

    if backend.gpu_available():
        pytest.skip("auto is cuda on this machine")
    settings = RunSettings(ClusterOptions("auto"), output_dir=str(tmp_path), name="small",
                           progress=False)
    runner.run_job(settings, lambda backend: _sized_job(2**20))
    small = load_summary(tmp_path / "small")["cluster"]
    assert (small["kind"], small["requested"]) == ("threads", "auto")
    assert "in this process" in small["why"] and "in this process" in capsys.readouterr().out
    assert len({w["pid"] for w in small["workers"]}) == 1
    # the same job with a memory limit per worker keeps worker processes
    limited = RunSettings(ClusterOptions("auto", workers=1, memory_limit="400MiB"),
                          output_dir=str(tmp_path), name="limited", progress=False)
    runner.run_job(limited, lambda backend: _sized_job(2**20))
    record = load_summary(tmp_path / "limited")["cluster"]
    assert (record["kind"], record["why"]) == ("local", None)
