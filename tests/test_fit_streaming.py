"""Fits stream: worker memory does not grow with the catalog, and stays under the limit."""

from __future__ import annotations

import dask

from outcore import cluster
from outcore.fit import fit_dipoles, simulate_catalog, status_counts
from outcore.fit.memory import FIT_WORKER_BASELINE_BYTES, memory_model
from outcore.plan import Plan
from outcore.runner import peak_worker_rss

#: Workers that hold numba's compiled fit loop (``FIT_WORKER_BASELINE_BYTES``) and a plan's budget.
LIMIT = 720 * 2**20


def _peak_for(n: int) -> tuple[int, dict]:
    catalog, _ = simulate_catalog(n, seed=11, dtype="float32", chunk_size=2048)
    assert isinstance(catalog["images"].data, dask.array.Array)  # never made on the client
    with cluster.connect("local", workers=2, memory_limit=LIMIT) as client:
        counts = status_counts(fit_dipoles(catalog, chunk_size=256))
        peak = max(peak_worker_rss(client).values())
    return peak, counts


def test_worker_memory_does_not_grow_with_the_catalog():
    small, small_counts = _peak_for(4_000)
    large, large_counts = _peak_for(24_000)
    assert sum(large_counts.values()) == 24_000 and large_counts["invalid_input"] == 0
    assert large < LIMIT and small < LIMIT
    assert large <= 1.15 * small, (small, large)  # 6x the candidates, the same footprint
    stages = memory_model(24_000, 256, (17, 17), "float32", "gaussian", variance=True)
    plan = Plan(stages, workers=2, memory_limit=LIMIT, baseline_bytes=FIT_WORKER_BASELINE_BYTES)
    assert plan.fits and large < plan.budget_bytes


def test_killed_worker_gives_the_same_fits():
    import os
    import signal
    import time

    import numpy as np
    import xarray as xr

    catalog, _ = simulate_catalog(6_000, seed=4, chunk_size=500)
    clean = fit_dipoles(catalog, chunk_size=250).compute(scheduler="sync")
    client = cluster.start("local", workers=2, memory_limit=LIMIT)
    try:
        futures = client.compute(fit_dipoles(catalog, chunk_size=250))
        deadline = time.monotonic() + 60
        while _fits_in_memory(client) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)  # kill once the first chunks are fitted, not after a fixed wait
        assert not futures.done()  # killed mid-run
        victim = cluster.placement(client)[0]["pid"]
        os.kill(victim, signal.SIGKILL)
        result = futures.result()
        assert victim not in {r["pid"] for r in cluster.placement(client)}
    finally:
        cluster.stop(client)
    xr.testing.assert_identical(result, clean)
    assert np.all(result["status"].values == clean["status"].values)


def _fits_in_memory(client) -> int:
    """How many fit tasks have finished (their results held by a worker)."""
    def count(dask_scheduler) -> int:
        return sum(ts.state == "memory" and "fit" in ts.prefix.name
                   for ts in dask_scheduler.tasks.values())

    return client.run_on_scheduler(count)
