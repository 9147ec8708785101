"""The planner refuses plans that cannot fit, and its projection matches measured memory."""

from __future__ import annotations

import os
import tracemalloc

import dask.array as da
import numpy as np
import pytest
import xarray as xr
import zarr

from outcore import reduce
from outcore.errors import PlanError
from outcore.plan import Plan, TaskMemory, suggest_chunk

MiB = 2**20


def stage(peak_mib: int, tasks: int = 10) -> TaskMemory:
    return TaskMemory("work", tasks, input_bytes=peak_mib * MiB, output_bytes=0)


def test_worker_projection_counts_concurrent_tasks_and_baseline():
    plan = Plan([stage(100)], workers=2, threads_per_worker=3, memory_limit="2 GiB",
                baseline_bytes=50 * MiB)
    assert plan.worker_peak_bytes == 50 * MiB + 3 * 100 * MiB
    assert plan.fits  # 350 MiB < 0.6 * 2 GiB


def test_oversized_plan_is_refused_with_its_fix():
    plan = Plan([stage(400)], workers=1, threads_per_worker=2, memory_limit="1 GiB")
    assert not plan.fits
    with pytest.raises(PlanError) as info:
        plan.check()
    message = str(info.value)
    assert "does not fit" in message and "Fix:" in message
    assert "smaller chunk" in message and "fewer threads" in message
    # the limit it names is enough
    bigger = Plan([stage(400)], 1, 2, memory_limit=plan.needed_limit_bytes)
    assert bigger.fits


def test_unlimited_plan_always_fits_and_reports():
    plan = Plan([stage(10_000)], memory_limit=None)
    assert plan.fits and "unlimited" in plan.table()


def test_suggest_chunk_picks_the_largest_that_fits():
    def plan_for(chunk: int) -> Plan:
        return Plan([stage(chunk)], 1, 1, memory_limit=1000 * MiB, baseline_bytes=0)

    chunk, plan = suggest_chunk(plan_for, [50, 100, 200, 400, 800, 1600])
    assert chunk == 400 and plan.fits  # 600 MiB budget
    with pytest.raises(PlanError):
        suggest_chunk(plan_for, [700, 900])


def test_projection_of_stack_statistics_within_measured_peak(tmp_path):
    """Model vs tracemalloc peak of one read-and-reduce task (0.8-1.5x)."""
    shape, chunks = (8, 64, 128, 128), (2, 64, 128, 128)
    path = tmp_path / "stack.zarr"
    values = np.random.default_rng(1).random(shape, dtype=np.float32)
    xr.Dataset({"data": (("scan_y", "scan_x", "k_y", "k_x"),
                         da.from_array(values, chunks=chunks))}).to_zarr(path, zarr_format=3)
    data = xr.open_zarr(path)["data"]
    model = {s.name: s for s in reduce.memory_model(data)}["read-and-reduce"]

    store = zarr.open_array(path / "data", mode="r")
    tracemalloc.start()
    try:
        block = store[0:2]  # one chunk, as the task reads it
        block.sum(axis=(0, 1), dtype=np.float64), block.max(axis=(0, 1))
        block.sum(axis=(2, 3), dtype=np.float64)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    ratio = model.peak_bytes / peak
    assert 0.8 <= ratio <= 1.5, ratio
    assert model.tasks == 4 and model.read_bytes == 2 * 64 * 128 * 128 * 4


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("given", [None, "auto", 0, "0", 0.25, "0.5", 1, 2**30, "2**30",
                                   "1GiB", "400 MiB", 3 * 2**40, "64TiB", 1.5])
def test_worker_memory_limit_reads_a_limit_as_distributed_does(given, threads):
    """``worker_memory_limit`` (which a run on dask's threaded scheduler plans with, never
    importing distributed) gives each worker what distributed's own parser gives it."""
    import logging

    from distributed.system import MEMORY_LIMIT
    from distributed.worker_memory import parse_memory_limit

    from outcore import backend
    from outcore.plan import worker_memory_limit

    assert backend.memory_limit() == MEMORY_LIMIT
    if given == "2**30":
        given = str(2**30)
    theirs = parse_memory_limit("auto" if given is None else given, threads,
                                total_cores=os.cpu_count() or 1,
                                logger=logging.getLogger("test"))
    assert worker_memory_limit(given, threads) == theirs
