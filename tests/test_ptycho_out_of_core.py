"""A diffraction stack 4x the worker memory limit reconstructs with ``disk`` residency,
the worker's peak memory under its limit, and the result equals a numpy twin."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest

from outcore import cluster
from outcore.plan import Plan
from outcore.ptycho.memory import memory_model
from outcore.ptycho.reconstruction import engine
from outcore.ptycho.reconstruction import model as physics
from outcore.runner import peak_worker_rss

from .ptycho_cases import aperture_probe

LIMIT = 400 * 2**20
K = 64


@pytest.mark.timeout(600)
def test_stack_four_times_the_worker_limit_streams_from_disk(tmp_path):
    """The stack repeats one raster (``repeats`` times), so one full-batch step of the whole
    stack equals one full-batch step of the raster alone: sums and illumination both scale
    by ``repeats``, which the preconditioned update divides out."""
    rng = np.random.default_rng(5)
    n = 200
    obj = (rng.uniform(0.6, 1, (n, n)) * np.exp(1j * rng.uniform(-1, 1, (n, n)))).astype(
        np.complex64)
    probe = aperture_probe(K, 12, 0.05)
    raster = np.array([[r, c] for r in range(0, n - K + 1, 6) for c in range(0, n - K + 1, 6)])
    cycle = np.sqrt(physics.intensities(obj, probe, raster)).astype(np.float32)
    repeats = -(-4 * LIMIT // cycle.nbytes) + 1
    stack = da.concatenate([da.from_array(cycle)] * repeats).rechunk((64, K, K))
    assert stack.nbytes >= 4 * LIMIT
    store = tmp_path / "big.zarr"
    stack.to_zarr(str(store), component="amplitudes", zarr_format=3)
    top_left = np.tile(raster, (repeats, 1))

    start = np.ones((n, n), np.complex64)
    settings = engine.Settings(iterations=1, residency="disk", probe_start=0, step_object=1.0,
                               step_probe=1.0, alpha=0.02)  # rPIE's, as the twin below
    plan = Plan(memory_model(len(top_left), K, (n, n), 1, "disk", settings.sub_batch), 1,
                memory_limit=LIMIT)
    assert plan.fits
    with cluster.connect("local", workers=1, memory_limit=LIMIT) as client:
        result = engine.run(client, store, top_left, start, probe, settings, chunk=64)
        peak = max(peak_worker_rss(client).values())
    print(f"stack {stack.nbytes / 2**20:.0f} MiB, worker peak {peak / 2**20:.0f} MiB of "
          f"{LIMIT / 2**20:.0f} MiB")
    assert peak < LIMIT, peak

    twin = physics.batch_terms(start, probe, raster, cycle)
    obj_twin, probe_twin = physics.update(start, probe, twin, raster, step_obj=1.0,
                                          step_probe=1.0, alpha=settings.alpha)
    assert result.loss[0] == pytest.approx(repeats * twin.loss, rel=1e-6)
    np.testing.assert_allclose(result.obj, obj_twin, atol=2e-5)
    np.testing.assert_allclose(result.probe, probe_twin, atol=2e-5)
