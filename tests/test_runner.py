"""run_job ends runs cleanly (a cluster whose workers all stay paused fails with a reason) and
starts the cluster auto chooses for the job."""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import replace

import dask
import dask.array as da

# distributed's config defaults before a test sets distributed.* keys: dask.config.set of a
# key not there yet deletes the whole tree on exit (outcore no longer imports it up front)
import distributed  # noqa: F401
import pytest

from outcore import runner, runs
from outcore.cluster import ClusterOptions
from outcore.errors import OutcoreError
from outcore.plan import Plan, Resources, TaskMemory
from outcore.progress import compute
from outcore.runs import load_summary
from outcore.settings import RunSettings
from outcore.verbs import Job


def _job() -> Job:
    def plan(resources: Resources) -> Plan:
        return Plan([TaskMemory("sum", 4, 2**20, 8)], resources.workers,
                    resources.threads_per_worker, None)

    def execute(run, client, plan) -> None:
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
            runner.run_job(settings, lambda resources: _job())
    assert time.perf_counter() - t0 < 60
    assert "--memory-limit" in info.value.fix
    summary = load_summary(tmp_path / "r")
    assert summary["status"] == "failed" and "paused" in summary["reason"]


def test_negative_rounds_are_refused_before_start(tmp_path):
    settings = RunSettings(ClusterOptions("threads"), output_dir=str(tmp_path),
                                  warmup_rounds=-1)
    with pytest.raises(OutcoreError, match="warmup-rounds"):
        runner.run_job(settings, lambda resources: _job())
    assert list(tmp_path.iterdir()) == []


def _sleepy_job() -> Job:
    def plan(resources: Resources) -> Plan:
        return Plan([TaskMemory("sleep", 1, 8, 8)], resources.workers, 1, None)

    def execute(run, client, plan) -> None:
        compute(client, dask.delayed(time.sleep)(120), show=False)

    return Job("stuck", {}, plan, execute)


def test_worker_timeout_ends_a_stuck_task(tmp_path):
    settings = RunSettings(ClusterOptions("local", workers=1, memory_limit="400MiB"),
                                  output_dir=str(tmp_path), name="r", progress=False,
                                  worker_timeout=2.0)
    t0 = time.perf_counter()
    with pytest.raises(OutcoreError, match="--worker-timeout"):
        runner.run_job(settings, lambda resources: _sleepy_job())
    assert time.perf_counter() - t0 < 45
    summary = load_summary(tmp_path / "r")
    assert summary["status"] == "failed" and "sleep" in summary["reason"]
    with pytest.raises(OutcoreError, match="positive"):
        runner.run_job(RunSettings(ClusterOptions("threads"), worker_timeout=0),
                       lambda resources: _sleepy_job())


def _sized_job(data_bytes: int) -> Job:
    """A job that says it reads ``data_bytes`` (its compute is a small sum)."""
    def plan(resources: Resources) -> Plan:
        return Plan([TaskMemory("sum", 1, 2**20, 8, read_bytes=data_bytes)],
                    resources.workers, resources.threads_per_worker, resources.memory_limit)

    def execute(run, client, plan) -> None:
        compute(client, da.ones((1000, 1000), chunks=500).sum(), show=False)

    return Job("sized", {}, plan, execute, data_bytes=data_bytes)


def test_auto_runs_a_small_job_in_process_and_says_why(tmp_path, capsys):
    from outcore import backend

    if backend.gpu_available():
        pytest.skip("auto is cuda on this machine")
    settings = RunSettings(ClusterOptions("auto"), output_dir=str(tmp_path), name="small",
                           progress=False)
    runner.run_job(settings, lambda resources: _sized_job(2**20))
    small = load_summary(tmp_path / "small")["cluster"]
    assert (small["kind"], small["requested"]) == ("threads", "auto")
    assert "in this process" in small["why"] and "in this process" in capsys.readouterr().out
    assert len({w["pid"] for w in small["workers"]}) == 1
    # the same job with a memory limit per worker keeps worker processes
    limited = RunSettings(ClusterOptions("auto", workers=1, memory_limit="400MiB"),
                          output_dir=str(tmp_path), name="limited", progress=False)
    runner.run_job(limited, lambda resources: _sized_job(2**20))
    record = load_summary(tmp_path / "limited")["cluster"]
    assert (record["kind"], record["why"]) == ("local", None)


def _reading_job(inputs: list, fail: bool = False) -> Job:
    """A job with ``inputs`` whose compute is a small sum, or raises when ``fail``."""
    def execute(run, client, plan) -> None:
        if fail:
            raise ValueError("the job failed")
        compute(client, da.ones((1000, 1000), chunks=500).sum(), show=False)

    job = _sized_job(2**20)
    return Job("reading", {}, job.plan, execute, inputs=inputs)


def test_inputs_are_hashed_while_the_job_runs_and_recorded_even_when_it_fails(tmp_path):
    source = tmp_path / "input.bin"
    source.write_bytes(bytes(range(256)) * 4096)
    store = tmp_path / "store.zarr"
    (store / "c").mkdir(parents=True)
    (store / "c" / "0").write_bytes(b"chunk")
    (store / "zarr.json").write_bytes(b"{}")
    tree = hashlib.sha256(b"c/0\0chunk" + b"zarr.json\0{}").hexdigest()
    settings = RunSettings(ClusterOptions("threads"), output_dir=str(tmp_path / "runs"),
                           name="ok", progress=False)
    runner.run_job(settings, lambda resources: _reading_job([source, store]))
    summary = load_summary(tmp_path / "runs" / "ok")
    assert [(i["path"], i["bytes"], i["sha256"]) for i in summary["inputs"]] == [
        (str(source), 2**20, hashlib.sha256(source.read_bytes()).hexdigest()),
        (str(store), 7, tree)]
    assert summary["timings_s"]["hash_inputs"] >= 0
    failed = replace(settings, name="failed")
    with pytest.raises(ValueError, match="the job failed"):
        runner.run_job(failed, lambda resources: _reading_job([source], fail=True))
    summary = load_summary(tmp_path / "runs" / "failed")
    assert summary["status"] == "failed"
    assert [i["path"] for i in summary["inputs"]] == [str(source)]
    assert summary["inputs"][0]["sha256"] in (None, hashlib.sha256(source.read_bytes())
                                              .hexdigest())


def test_hashing_stops_at_its_next_block_when_the_run_ends_first(tmp_path, monkeypatch):
    source = tmp_path / "input.bin"
    source.write_bytes(b"x" * 2**22)
    monkeypatch.setattr(runs, "_HASH_BLOCK", 1)  # 4 million blocks: seconds of hashing
    run = runs.Run.create(tmp_path / "runs", "r", "demo", {})
    t0 = time.perf_counter()
    with runner.InputHashes(run, [source]):
        pass
    assert time.perf_counter() - t0 < 1.0
    entry = load_summary(run.path)["inputs"][0]
    assert (entry["path"], entry["bytes"], entry["sha256"]) == (str(source), 2**22, None)


def test_the_job_is_planned_once_and_its_choices_reach_execute(tmp_path):
    """One plan, made on the running cluster's resources, is the one execute receives and
    whose config entries the run records."""
    planned, executed = [], []

    def plan(resources: Resources) -> Plan:
        chosen = {"blocks": 7, "workers": resources.workers}
        planned.append(chosen)
        return Plan([TaskMemory("sum", 1, 2**20, 8)], resources.workers,
                    resources.threads_per_worker, resources.memory_limit, choices=chosen,
                    config={"blocks": 7})

    def execute(run, client, plan) -> None:
        executed.append(plan.choices)
        compute(client, da.ones((100, 100), chunks=50).sum(), show=False)

    made = []

    def factory(resources: Resources) -> Job:
        made.append(resources)
        return Job("once", {"blocks": None}, plan, execute)

    settings = RunSettings(ClusterOptions("threads", workers=2), output_dir=str(tmp_path),
                           name="r", progress=False)
    runner.run_job(settings, factory)
    assert len(planned) == 1 and executed == planned
    assert planned[0]["workers"] == 2 and made[0].workers == 2
    summary = load_summary(tmp_path / "r")
    assert summary["config"]["blocks"] == 7


def _compute_only_job(clients: list) -> Job:
    """A job that only computes a dask collection (``local_scheduler``), noting the client
    ``execute`` got."""
    job = _sized_job(2**20)

    def execute(run, client, plan) -> None:
        clients.append(client)
        assert compute(client, da.ones((100, 100), chunks=50).sum(), show=False) == [10_000]

    return replace(job, execute=execute, local_scheduler=True)


@pytest.mark.parametrize(("options", "cluster_started"), [
    ({}, False),                                       # threads, nothing asked: no cluster
    ({"dashboard": True}, True),                       # a dashboard needs distributed's
    ({"report": "always"}, True),                      # so does Dask's report
    ({"worker_timeout": 60.0}, True),                  # and the watch on stuck tasks
])
def test_in_process_workers_start_a_dask_cluster_only_for_what_needs_one(
        tmp_path, options, cluster_started):
    """A compute-only job on in-process workers runs on dask's threaded scheduler (no client,
    the summary's scheduler ``dask.threaded``, this process its one worker, no report) unless
    a dashboard, a report or a worker timeout is asked for; the answer is the same."""
    clients: list = []
    report = options.pop("report", "auto")
    opts = ClusterOptions("threads", workers=2, dashboard=options.pop("dashboard", False))
    settings = RunSettings(opts, output_dir=str(tmp_path), name="r", progress=False,
                           report=report, **options)
    runner.run_job(settings, lambda resources: _compute_only_job(clients))
    summary = load_summary(tmp_path / "r")
    assert (clients[0] is not None) == cluster_started
    workers = summary["cluster"]["workers"]
    if cluster_started:
        assert summary["cluster"]["scheduler"].startswith("inproc://") and len(workers) == 2
    else:
        assert summary["cluster"]["scheduler"] == "dask.threaded"
        assert summary["cluster"]["dashboard"] is None
        assert [(w["pid"], w["threads"]) for w in workers] == [(os.getpid(), 2)]
        assert "threaded scheduler" in summary["report"]["why"]
    assert (tmp_path / "r" / runs.REPORT).exists() == (report == "always")
    assert len(summary["metrics"]["peak_worker_rss_bytes"]) == (2 if cluster_started else 1)


def test_the_performance_report_is_written_when_asked_or_long_and_recorded_either_way(
        tmp_path, monkeypatch):
    """On a Dask cluster: ``auto`` writes Dask's report for a job that ran at least
    REPORT_AFTER_S (measured when it ends) and not for a shorter one, ``never`` never,
    ``always`` always; summary.json says which and why, ``timings_s.report`` its cost."""
    def run(name: str, when: str) -> dict:
        settings = RunSettings(ClusterOptions("threads", workers=1), output_dir=str(tmp_path),
                               name=name, progress=False, report=when)
        runner.run_job(settings, lambda resources: _sized_job(2**20))
        return load_summary(tmp_path / name)

    short = run("short", "auto")
    assert short["report"]["path"] is None and short["report"]["when"] == "auto"
    assert f"under the {runs.REPORT_AFTER_S:g} s" in short["report"]["why"]
    assert "report" not in short["timings_s"]
    never = run("never", "never")
    assert never["report"] == {"path": None, "when": "never", "why": "not asked for"}
    always = run("always", "always")
    assert always["report"]["path"] == str(tmp_path / "always" / runs.REPORT)
    assert always["timings_s"]["report"] > 0
    monkeypatch.setattr(runs, "REPORT_AFTER_S", 0.0)  # every job is long enough now
    long = run("long", "auto")
    assert long["report"]["path"] and "at least the 0 s" in long["report"]["why"]
    for name, written in (("short", False), ("never", False), ("always", True),
                          ("long", True)):
        assert (tmp_path / name / runs.REPORT).exists() == written, name
