"""The data-parallel reconstruction: one trajectory whatever the workers and residency,
convergence to the truth, resume and a killed worker."""

from __future__ import annotations

import os
import signal
from dataclasses import replace

import numpy as np
import pytest
import zarr

from outcore import cluster
from outcore.ptycho.reconstruction import engine, solver
from outcore.ptycho.reconstruction import probe as probes
from outcore.ptycho.reconstruction.model import Model
from outcore.ptycho.reconstruction.quality import illuminated, object_error

from .ptycho_cases import make_scan, pupil_guess, true_scan, write_store

LIMIT = 600 * 2**20


@pytest.fixture(scope="module")
def scan():
    return make_scan()


@pytest.fixture(scope="module")
def store(scan, tmp_path_factory):
    return write_store(scan, tmp_path_factory.mktemp("ptycho") / "scan.zarr", chunk=16)


def _run(client, scan, store, **kw):
    settings = engine.Settings(**({"iterations": 8, "batch_size": 32} | kw))
    return engine.run(client, store, scan.top_left, np.ones(scan.truth.shape, np.complex64),
                      scan.guess, settings, chunk=16)


def _error(scan, obj):
    return object_error(obj, scan.truth, illuminated(scan.probe, scan.top_left, obj.shape))


@pytest.fixture(scope="module")
def everything(tmp_path_factory):
    """A scan and settings with every option on: sub-pixel positions recorded up to a pixel
    off and refined, two probe modes, two slices, Poisson counts, a detector mask."""
    scan = true_scan(side=6, k=32, step=4, jitter=1.5, modes=(1.0, 0.5), slices=2,
                     thickness=0.02, dose=1e5, margin=4, seed=9)
    store = tmp_path_factory.mktemp("everything") / "scan.zarr"
    group = zarr.open_group(store, mode="w-", zarr_format=3)
    group.create_array("amplitudes", shape=scan.counts.shape, chunks=(8, 32, 32),
                       dtype="float32")[:] = scan.amplitudes()
    q = np.fft.fftfreq(32) * 32
    valid = np.ones((32, 32), bool)
    valid[:3, :5] = False
    model = Model("poisson", valid, np.exp(-1j * scan.thickness * (q[:, None] ** 2
                                                                   + q[None, :] ** 2)))
    errors = np.random.default_rng(1).uniform(-1, 1, scan.centres.shape)
    settings = engine.Settings(iterations=4, batch_size=12, sub_batch=5, noise="poisson",
                               probe_modes=2, refine_positions=True, refine_from=1,
                               slices=2, slice_thickness=1e-6, probe_start=1)
    probe = probes.initial_modes(pupil_guess(scan, 0.1), 2)
    obj = np.ones((2, *scan.slices[0].shape), np.complex64)
    return store, scan.corners() + errors, obj, probe, settings, model, scan


def test_one_trajectory_for_1_2_3_workers_and_every_residency_with_every_option(everything,
                                                                              shared_cluster):
    """The engine on 1, 2 and 3 workers and in every residency against its numpy twin
    ``solver.serial``, with every option on: the same losses (1e-5 relative, float32
    state), object, probe modes and refined positions."""
    store, coords, obj, probe, settings, model, scan = everything
    amplitudes = scan.amplitudes()
    twin, trajectory = solver.serial(lambda p: amplitudes[p],
                                     solver.State(obj, probe, coords.copy()), settings,
                                     model.on(np))
    assert np.abs(twin.coords - coords).max() > 0.01  # the positions did move
    results = {}
    for workers in (1, 2, 3):
        client = shared_cluster(workers, LIMIT)
        residencies = engine.RESIDENCIES if workers == 2 else ("host",)
        for residency in residencies:
            results[workers, residency] = engine.run(
                client, store, coords, obj, probe, replace(settings, residency=residency),
                model=model, chunk=8)
    for key, result in results.items():
        np.testing.assert_allclose(result.loss, trajectory.losses, rtol=1e-5, err_msg=str(key))
        np.testing.assert_allclose(result.obj, twin.obj, atol=1e-5, err_msg=str(key))
        np.testing.assert_allclose(result.probe, twin.probe, atol=1e-5 * np.abs(probe).max(),
                                   err_msg=str(key))
        np.testing.assert_allclose(result.coords, twin.coords, atol=1e-6, err_msg=str(key))
        assert result.obj.shape == obj.shape and result.probe.shape == probe.shape


def test_serial_twin_gives_the_same_trajectory(scan, store, shared_cluster):
    """The cluster's run against a plain loop over the same batches with the model's terms and
    update."""
    from outcore.ptycho.reconstruction import model as physics

    fixed = dict(step_object=1.0, step_probe=1.0, alpha=0.02)  # rPIE's, written out below
    settings = engine.Settings(iterations=4, batch_size=40, probe_start=1, **fixed)
    obj, probe, losses = np.ones(scan.truth.shape, np.complex64), scan.guess, []
    for it in range(settings.iterations):
        total = 0.0
        for batch in engine.batches(len(scan.top_left), 40, settings.seed, it):
            terms = physics.batch_terms(obj, probe, scan.top_left[batch], scan.amplitudes[batch])
            obj, probe = physics.update(obj, probe, terms, scan.top_left[batch], step_obj=1.0,
                                        step_probe=1.0 if it >= 1 else 0.0,
                                        alpha=settings.alpha)
            total += terms.loss
        losses.append(total)
    result = _run(shared_cluster(2, LIMIT), scan, store, iterations=4, batch_size=40,
                  probe_start=1, **fixed)
    np.testing.assert_allclose(result.loss, losses, rtol=1e-6)
    np.testing.assert_allclose(result.obj, obj, atol=1e-5)


def test_noise_free_scan_reconstructs_within_2_percent(scan, store, shared_cluster):
    result = _run(shared_cluster(2, LIMIT), scan, store, iterations=40, batch_size=32)
    assert _error(scan, result.obj) < 0.02
    assert result.loss[-1] < 1e-2 * result.loss[0]


def test_noisy_scan_improves_monotonically_at_first(tmp_path, shared_cluster):
    noisy = make_scan(dose=1e5, seed=2)
    store = write_store(noisy, tmp_path / "noisy.zarr")
    errors = []
    engine.run(shared_cluster(1, LIMIT), store, noisy.top_left,
               np.ones(noisy.truth.shape, np.complex64), noisy.guess,
               engine.Settings(iterations=8, batch_size=32), chunk=16,
               on_iteration=lambda i, loss, state: errors.append(_error(noisy, state.obj)))
    assert np.all(np.diff(errors) < 0), errors
    assert errors[-1] < 0.7 * errors[0]


def test_resumed_run_equals_uninterrupted(scan, store, shared_cluster):
    client = shared_cluster(2, LIMIT)
    whole = _run(client, scan, store, iterations=6)
    first = _run(client, scan, store, iterations=3)
    rest = engine.run(client, store, scan.top_left, first.obj, first.probe,
                      engine.Settings(iterations=6, batch_size=32), chunk=16,
                      start_iteration=3, losses=first.loss)
    np.testing.assert_array_equal(rest.obj, whole.obj)
    np.testing.assert_array_equal(rest.probe, whole.probe)
    np.testing.assert_array_equal(rest.loss, whole.loss)


def test_killed_worker_gives_the_same_result(scan, store):
    client = cluster.start("local", workers=2, memory_limit=LIMIT)
    try:
        clean = _run(client, scan, store, iterations=6)
        victims = []

        def kill_once(iteration, loss, state):
            if iteration == 2 and not victims:
                victims.append(cluster.placement(client)[1]["pid"])
                os.kill(victims[0], signal.SIGKILL)

        settings = engine.Settings(iterations=6, batch_size=32)
        hit = engine.run(client, store, scan.top_left, np.ones(scan.truth.shape, np.complex64),
                         scan.guess, settings, chunk=16, on_iteration=kill_once)
        assert victims and victims[0] not in {r["pid"] for r in cluster.placement(client)}
    finally:
        cluster.stop(client)
    np.testing.assert_array_equal(hit.obj, clean.obj)
    np.testing.assert_array_equal(hit.loss, clean.loss)


def test_bad_settings_fail_before_compute():
    from outcore.errors import OutcoreError

    for bad in (dict(residency="gpu"), dict(batch_size=0), dict(iterations=0),
                dict(batch_size=10_000), dict(alpha=2.0), dict(probe_modes=0),
                dict(slice_thickness=1e-6), dict(slices=2), dict(noise="gauss"),
                dict(position_bound=0.0), dict(probe_support=0.0), dict(tolerance=0.0)):
        with pytest.raises(OutcoreError):
            engine.Settings(**bad).validate(169)


@pytest.mark.gpu
def test_cupy_backend_follows_the_numpy_trajectory(scan, store):
    settings = engine.Settings(iterations=6, batch_size=32)
    start = np.ones(scan.truth.shape, np.complex64)
    with cluster.connect("local", workers=2, memory_limit=LIMIT) as client:
        reference = engine.run(client, store, scan.top_left, start, scan.guess, settings,
                               chunk=16)
        for residency in engine.RESIDENCIES:
            result = engine.run(client, store, scan.top_left, start, scan.guess,
                                engine.Settings(iterations=6, batch_size=32,
                                                residency=residency), chunk=16, backend="cupy")
            np.testing.assert_allclose(result.loss, reference.loss, rtol=1e-4)
            np.testing.assert_allclose(result.obj, reference.obj, atol=1e-3)
