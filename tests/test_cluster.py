"""Cluster kinds: options checked before start, threads devices agree, loopback dashboard
(worker processes always; in-process workers when asked, without bokeh otherwise),
in-process workers sharing one process's memory, auto's choice of in-process workers."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from urllib.parse import urlparse

import dask.array as da
import numpy as np
import pytest
import xarray as xr

from outcore import cluster, reduce
from outcore.errors import ClusterError


@pytest.mark.parametrize(
    ("kind", "options", "words"),
    [
        ("local", {"device_memory_limit": "1GiB"}, "does not apply"),
        ("threads", {"device_memory_limit": "1GiB"}, "device_memory_limit="),
        ("mpi", {"workers": 3}, "mpirun"),
        ("tcp://127.0.0.1:1", {"memory_limit": "1GiB"}, "existing cluster"),
        ("tcp://127.0.0.1:1", {"workers": 2}, "workers="),
        ("bogus", {}, "Unknown cluster"),
        ("local", {"workers": 0}, "at least 1"),
        ("local", {"memory_limit": "lots"}, "not a size"),
    ],
)
def test_options_that_do_not_apply_are_refused_before_start(kind, options, words):
    with pytest.raises(ClusterError, match=words) as info:
        cluster.ClusterOptions(kind=kind, **options).validate()
    assert info.value.fix


def test_cuda_without_gpu_is_a_clear_error():
    from outcore import backend

    if backend.gpu_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ClusterError, match="needs a CUDA GPU"):
        cluster.start("cuda")
    assert cluster.ClusterOptions(kind="auto").resolved_kind() == "local"


def test_cuda_names_why_dask_cuda_does_not_import(monkeypatch, tmp_path):
    """A GPU is visible but dask-cuda fails to import: the error carries the import's own
    message (issue 28), and ``auto`` falls back to local workers."""
    import sys

    from outcore import backend

    broken = tmp_path / "dask_cuda"
    broken.mkdir()
    (broken / "__init__.py").write_text(
        "raise ImportError('libcudart.so.12: cannot open shared object file')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "dask_cuda", raising=False)
    monkeypatch.setattr(backend, "gpu_available", lambda: True)
    with pytest.raises(ClusterError, match=r"needs dask-cuda, which does not import here "
                       r"\(ImportError: libcudart.so.12: cannot open shared object file\)"):
        cluster.ClusterOptions(kind="cuda").validate()
    assert cluster.ClusterOptions(kind="auto").resolved_kind() == "local"


def _statistics(client) -> xr.Dataset:
    values = np.random.default_rng(7).random((12, 5, 16, 16), dtype=np.float32)
    data = xr.DataArray(da.from_array(values, chunks=(2, 5, 16, 16)),
                        dims=("scan_y", "scan_x", "k_y", "k_x"))
    return reduce.stack_statistics(data).compute()


def test_threads_devices_1_2_3_give_the_same_answer():
    answers = []
    for workers in (1, 2, 3):
        with cluster.connect("threads", workers=workers) as client:
            assert len(client.scheduler_info()["workers"]) == workers
            answers.append(_statistics(client))
    for other in answers[1:]:
        xr.testing.assert_identical(answers[0], other)
    truth = np.random.default_rng(7).random((12, 5, 16, 16), dtype=np.float32)
    np.testing.assert_allclose(answers[0]["mean"], truth.mean(axis=(0, 1)), rtol=1e-6)


def _dashboard_answers_on_loopback(client) -> None:
    link = client.dashboard_link
    assert urlparse(link).hostname == "127.0.0.1"
    with urllib.request.urlopen(link, timeout=10) as response:
        assert response.status == 200


def test_threads_cluster_serves_no_dashboard_unless_asked_and_imports_no_bokeh():
    """A fresh process: in-process workers start without a dashboard (an empty link, bokeh
    never imported) and still answer health checks on loopback; asked, they serve one."""
    probe = (
        "import sys, urllib.request\n"
        "from outcore import cluster\n"
        "client = cluster.start('threads', workers=1)\n"
        "http = client.cluster.scheduler.http_server\n"
        "health = urllib.request.urlopen(f'http://{http.address}:{http.port}/health',"
        " timeout=10).read().decode()\n"
        "print('LINK', repr(client.dashboard_link), health, http.address)\n"
        "print('BOKEH', sorted(m for m in sys.modules if m.split('.')[0] == 'bokeh')[:3])\n"
        "cluster.stop(client)\n"
        "client = cluster.start('threads', workers=1, dashboard=True)\n"
        "print('ASKED', client.dashboard_link)\n"
        "cluster.stop(client)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, timeout=120).stdout
    assert "LINK '' ok 127.0.0.1" in out and "BOKEH []" in out, out
    asked = out.split("ASKED ")[1].split()[0]
    assert urlparse(asked).hostname == "127.0.0.1"
    assert not cluster.ClusterOptions(kind="threads").serves_dashboard
    assert cluster.ClusterOptions(kind="threads", dashboard=True).serves_dashboard
    assert all(cluster.ClusterOptions(kind=k).serves_dashboard for k in ("local", "mpi"))


def test_local_cluster_dashboard_on_loopback_and_placement():
    client = cluster.start("local", workers=2, memory_limit="400MiB")
    try:
        _dashboard_answers_on_loopback(client)
        records = cluster.placement(client)
        assert len(records) == 2
        assert {r["memory_limit_bytes"] for r in records} == {400 * 2**20}
        assert all(r["pid"] and r["threads"] == 1 and r["gpu_name"] is None for r in records)
        assert len({r["pid"] for r in records}) == 2
        assert cluster.total_memory_limit(client) == 800 * 2**20
        assert "memory" in cluster.placement_table(records)
    finally:
        t0 = time.perf_counter()
        cluster.stop(client, timeout=20)
        assert time.perf_counter() - t0 < 25


def test_threads_cluster_dashboard_answers_and_memory_is_shared():
    """In-process workers asked for a dashboard: its link answers, and pausing happens when
    the one process reaches 80 % of all the workers' limits together (not of one's)."""
    client = cluster.start("threads", workers=2, memory_limit="400MiB", dashboard=True)
    try:
        _dashboard_answers_on_loopback(client)
        managers = client.run(lambda dask_worker: (
            dask_worker.memory_manager.memory_limit,
            dask_worker.memory_manager.memory_pause_fraction,
            dask_worker.memory_manager.memory_spill_fraction,
            dask_worker.memory_manager.memory_target_fraction))
        assert len(managers) == 2
        for limit, pause, spill, target in managers.values():
            assert limit == 400 * 2**20
            assert pause * limit == pytest.approx(0.8 * 800 * 2**20)
            assert spill is False and target == 0.6
        assert len({r["pid"] for r in cluster.placement(client)}) == 1
    finally:
        cluster.stop(client)


def test_threads_and_local_start_as_many_workers_by_default():
    import os

    expected = min(os.cpu_count() or 1, 4)
    for kind in ("threads", "local"):
        assert cluster.ClusterOptions(kind=kind).default_workers() == expected
    assert cluster.ClusterOptions(kind="threads", workers=3).default_workers() == 3


def test_auto_runs_small_jobs_in_process_and_keeps_processes_otherwise():
    from outcore import backend

    if backend.gpu_available():
        pytest.skip("auto is cuda on this machine")
    auto = cluster.ClusterOptions(kind="auto")
    ceiling = cluster.IN_PROCESS_DATA_FRACTION * backend.host_memory()["total_bytes"]
    assert "in this process" in cluster.in_process_reason(auto, 2**20)
    assert cluster.in_process_reason(auto, int(ceiling) + 1) is None
    for opts in (cluster.ClusterOptions(kind="auto", memory_limit="1GiB"),
                 cluster.ClusterOptions(kind="local"), cluster.ClusterOptions(kind="threads")):
        assert cluster.in_process_reason(opts, 2**20) is None


def test_joining_a_scheduler_address():
    with cluster.connect("threads", workers=1) as first:
        address = first.scheduler.address
        joined = cluster.start(address)
        try:
            assert joined.submit(lambda x: x + 1, 1).result() == 2
        finally:
            cluster.stop(joined)


def test_joining_a_scheduler_without_workers_is_a_clear_error(monkeypatch):
    import distributed

    monkeypatch.setattr(cluster.address, "JOIN_WORKER_TIMEOUT_S", 2.0)
    with distributed.LocalCluster(n_workers=0, processes=False, dashboard_address=None) as lc:
        with pytest.raises(ClusterError, match="no worker"):
            cluster.start(lc.scheduler_address)


def test_mpi_ranks_with_a_gpu_run_dask_cuda_workers(monkeypatch):
    """A rank that sees a GPU (and imports dask-cuda) starts a CUDAWorker carrying the device
    limit; a rank without one starts a plain Worker."""
    from outcore import backend
    from outcore.cluster import cuda

    options = cluster.ClusterOptions(kind="mpi", device_memory_limit="30GiB")
    options.validate()  # accepted for mpi now (GPU ranks use it)
    monkeypatch.setattr(backend, "devices", lambda: [{"index": 0, "name": "H200"}])
    monkeypatch.setattr(cuda, "import_failure", lambda: None)
    assert cluster.mpi_worker_class(options) == ("dask_cuda.CUDAWorker",
                                                 {"device_memory_limit": "30GiB"})
    monkeypatch.setattr(backend, "devices", lambda: [])
    plain = cluster.ClusterOptions(kind="mpi")
    assert cluster.mpi_worker_class(plain) == ("distributed.Worker", {})


def test_an_mpi_rank_whose_dask_cuda_does_not_import_says_why(monkeypatch, caplog):
    """A rank that sees a GPU but cannot import dask-cuda (a CUDA library it needs is
    missing) runs a plain worker and logs the import's own error, rather than trying
    CUDAWorker on the strength of the package being installed; with the import working it
    runs CUDAWorker with the device memory limit."""
    import logging

    from outcore.cluster import ClusterOptions, cuda, mpi

    class Rank:
        def Get_rank(self) -> int:  # noqa: N802 (mpi4py's name)
            return 3

    monkeypatch.setattr(mpi, "_mpi_comm", lambda: Rank())
    monkeypatch.setattr(mpi.backend, "devices", lambda: [{"name": "GPU"}])
    monkeypatch.setattr(cuda, "import_failure", lambda: "ImportError: libcudart.so.13")
    opts = ClusterOptions(kind="mpi", device_memory_limit="4GiB")
    with caplog.at_level(logging.WARNING, logger="outcore.cluster.mpi"):
        assert mpi.mpi_worker_class(opts) == ("distributed.Worker", {})
    assert "rank 3 sees a GPU but dask-cuda does not import (ImportError: libcudart.so.13)" \
        in caplog.text
    monkeypatch.setattr(cuda, "import_failure", lambda: None)
    assert mpi.mpi_worker_class(opts) == ("dask_cuda.CUDAWorker",
                                          {"device_memory_limit": "4GiB"})
