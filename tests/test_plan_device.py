"""The device budget of a plan: stages state their host and device bytes; a plan whose device
bytes exceed a stated device size is refused before compute with the fix, for the fit and
tomography families and from ``outcore plan`` (ptycho's: tests/test_ptycho_cli.py). All on
the CPU, with the device size stated."""

from __future__ import annotations

import numpy as np
import pytest

from outcore.cli import main
from outcore.errors import PlanError
from outcore.fit import simulate_catalog
from outcore.fit.memory import memory_model as fit_memory
from outcore.plan import DEVICE_BASELINE_BYTES, Plan, Resources, TaskMemory
from outcore.tomo.geometry import scan_for
from outcore.tomo.memory import memory_model as tomo_memory

MiB = 2**20


def test_device_peak_is_concurrent_device_tasks_plus_the_context():
    stages = [TaskMemory("a", 8, 10 * MiB, 0, device_bytes=300 * MiB),
              TaskMemory("b", 8, 50 * MiB, 0, device_bytes=100 * MiB)]
    plan = Plan(stages, workers=2, threads_per_worker=2, memory_limit=2**30,
                device_memory_limit=2**30)
    assert plan.device_peak_bytes == DEVICE_BASELINE_BYTES + 2 * 300 * MiB
    assert plan.worker_peak_bytes == plan.baseline_bytes + 2 * 50 * MiB  # host side alone
    assert plan.host_fits and not plan.device_fits and not plan.fits  # 1112 > 0.9 * 1024 MiB
    with pytest.raises(PlanError) as refused:
        plan.check(["use a smaller chunk"], ["keep the targets in host memory"])
    assert "does not fit the GPU" in refused.value.problem and "'a'" in refused.value.problem
    fix = refused.value.fix
    assert fix.startswith("keep the targets in host memory") and "workers=4" in fix


def test_no_device_limit_or_no_device_bytes_means_no_device_check():
    plan = Plan([TaskMemory("a", 1, 1, 1, device_bytes=2**40)], memory_limit=2**30)
    assert plan.device_budget_bytes is None and plan.fits
    host_only = Plan([TaskMemory("a", 1, 1, 1)], memory_limit=2**30, device_memory_limit=1)
    assert host_only.device_peak_bytes == 0 and host_only.fits


def test_the_table_shows_a_device_column_and_verdict():
    plan = Plan([TaskMemory("kernel", 4, MiB, MiB, device_bytes=64 * MiB)], memory_limit=2**30,
                device_memory_limit=256 * MiB)
    table = plan.table()
    assert "device" in table.splitlines()[0]
    assert "64.00 MiB" in table.splitlines()[2]
    assert "device: projected peak per GPU worker 576.00 MiB" in table and "DOES NOT FIT" in table


def test_fit_chunks_on_the_device_are_device_bytes_not_host_bytes():
    numpy_stages = fit_memory(10**5, 4096, (17, 17), backend="numpy")
    cupy_stages = fit_memory(10**5, 4096, (17, 17), backend="cupy")
    assert numpy_stages[0].device_bytes == 0
    assert cupy_stages[0].transient_bytes == 0 < cupy_stages[0].device_bytes
    assert cupy_stages[0].device_bytes > numpy_stages[0].transient_bytes
    small_gpu = Resources(2, 1, 2**33, "cupy", device_memory_limit=2**30)
    with pytest.raises(PlanError, match="does not fit the GPU"):
        Plan.of(fit_memory(10**6, 2**17, (17, 17), backend="cupy"), small_gpu).check()
    assert Plan.of(fit_memory(10**6, 4096, (17, 17), backend="cupy"), small_gpu).fits


def test_tomo_blocks_on_the_device_count_on_both_sides():
    shape = (256, 256, 256)
    geometry = scan_for("parallel", shape, 360)
    host = tomo_memory(geometry, shape, "views", 360, 256)
    device = tomo_memory(geometry, shape, "views", 360, 256, backend="cupy")
    kernels = [s for s in device if s.name in ("forward", "backproject")]
    assert all(s.device_bytes == s.peak_bytes > 0 for s in kernels)
    assert [s.peak_bytes for s in host] == [s.peak_bytes for s in device]
    small_gpu = Resources(1, 1, 2**34, "cupy", device_memory_limit=600 * MiB)
    with pytest.raises(PlanError, match="does not fit the GPU"):
        Plan.of(device, small_gpu).check()
    thin = tomo_memory(geometry, shape, "views", 10, 4, backend="cupy")
    assert Plan.of(thin, small_gpu).fits


@pytest.fixture(scope="module")
def catalog_npz(tmp_path_factory):
    catalog, _ = simulate_catalog(64, stamp=11, seed=1)
    path = tmp_path_factory.mktemp("cat") / "cat.npz"
    np.savez(path, **{name: catalog[name].values for name in
                      ("images", "variance", "candidate_id")})
    return path


def test_outcore_plan_refuses_a_gpu_plan_over_the_stated_device_size(catalog_npz, capsys):
    """``outcore plan --backend cupy`` plans GPU workers on this CPU machine: a chunk whose
    device bytes exceed ``--device-memory-limit`` exits 1 and says why; a small one fits."""
    common = ["plan", "fit-dipoles", "--input", str(catalog_npz), "--cluster", "cuda",
              "--workers", "1", "--backend", "cupy", "--memory-limit", "4GiB"]
    assert main([*common, "--device-memory-limit", "520MiB", "--chunk-size", "64"]) == 1
    out = capsys.readouterr().out
    assert "device" in out.splitlines()[0] and "DOES NOT FIT" in out
    assert main([*common, "--device-memory-limit", "2GiB", "--chunk-size", "64"]) == 0
    assert "device: projected peak per GPU worker" in capsys.readouterr().out
