"""The far-field model's gradients against finite differences, and its update's algebra."""

from __future__ import annotations

import numpy as np
import pytest

from outcore.ptycho import kernels
from outcore.ptycho.memory import SCRATCH_PER_PIXEL

from .ptycho_cases import aperture_probe, make_scan


@pytest.fixture(scope="module")
def problem():
    rng = np.random.default_rng(3)
    k, n = 16, 40
    obj = (rng.uniform(0.5, 1, (n, n)) * np.exp(1j * rng.uniform(-1, 1, (n, n))))
    probe = aperture_probe(k, 5, 0.1).astype(np.complex128)
    top_left = np.array([[r, c] for r in range(0, n - k + 1, 4) for c in range(0, n - k + 1, 4)])
    measured = np.sqrt(kernels.intensities(obj, probe, top_left)) * 1.1 + 0.01
    return obj, probe, top_left, measured


@pytest.mark.parametrize("which", ["object", "probe"])
def test_gradient_matches_finite_differences(problem, which):
    obj, probe, top_left, measured = problem
    terms = kernels.batch_terms(obj, probe, top_left, measured)
    grad = terms.full_grad_obj(obj.shape) if which == "object" else terms.grad_probe
    target = obj if which == "object" else probe
    rng = np.random.default_rng(1)
    for _ in range(6):
        idx = tuple(rng.integers(0, n) for n in (target.shape if which == "probe"
                                                 else (30, 30)))
        for direction in (1.0, 1j):
            h = 1e-6 * direction
            plus, minus = target.copy(), target.copy()
            plus[idx] += h
            minus[idx] -= h
            args = (lambda t: (t, probe)) if which == "object" else (lambda t: (obj, t))
            fd = (kernels.loss(*args(plus), top_left, measured)
                  - kernels.loss(*args(minus), top_left, measured)) / 2e-6
            analytic = (np.conj(grad[idx]) * direction).real
            assert fd == pytest.approx(analytic, rel=1e-5, abs=1e-7)


def test_terms_of_parts_add_up_to_the_whole(problem):
    obj, probe, top_left, measured = problem
    whole = kernels.batch_terms(obj, probe, top_left, measured)
    parts = [kernels.batch_terms(obj, probe, top_left[s], measured[s])
             for s in (slice(0, 7), slice(7, 20), slice(20, None))]
    summed = parts[0] + parts[1] + parts[2]
    assert summed.loss == pytest.approx(whole.loss, rel=1e-12)
    assert summed.loss == pytest.approx(kernels.loss(obj, probe, top_left, measured), rel=1e-12)
    np.testing.assert_allclose(summed.full_grad_obj(obj.shape), whole.full_grad_obj(obj.shape),
                               rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(summed.grad_probe, whole.grad_probe, rtol=1e-12)
    assert summed.count == len(top_left)


def test_one_position_step_is_the_modulus_projection(problem):
    """alpha = 0, step 1, one window: the new exit wave's far field has the measured
    amplitude exactly (the probe is non-zero everywhere on its window)."""
    obj, probe, top_left, measured = problem
    one = top_left[5:6]
    gaussian = np.exp(-((np.mgrid[:16, :16] - 8) ** 2).sum(0) / 30).astype(np.complex128)
    terms = kernels.batch_terms(obj, gaussian, one, measured[5:6])
    new_obj, _ = kernels.update(obj, gaussian, terms, one, step_obj=1.0, step_probe=0.0,
                                alpha=0.0)
    far = np.abs(kernels.farfield(new_obj, gaussian, one))
    np.testing.assert_allclose(far, measured[5:6], rtol=1e-9, atol=1e-9)
    untouched = np.ones(obj.shape, bool)
    untouched[one[0, 0]:one[0, 0] + 16, one[0, 1]:one[0, 1] + 16] = False
    np.testing.assert_array_equal(new_obj[untouched], obj[untouched])


def test_farfield_is_centred_and_unitary():
    """A flat object under a flat probe sends all its energy to the centre pixel K//2."""
    k = 8
    far = kernels.farfield(np.ones((k, k), np.complex64), np.ones((k, k), np.complex64),
                           np.zeros((1, 2), int))
    assert abs(far[0, k // 2, k // 2]) == pytest.approx(k, rel=1e-6)
    assert (abs(far[0]) ** 2).sum() == pytest.approx(k * k, rel=1e-6)


def test_scratch_model_bounds_tracemalloc():
    """The memory model's scratch per position against tracemalloc's peak of a real call."""
    import tracemalloc

    scan = make_scan(k=64, steps=7, step=8)
    obj = scan.truth.copy()
    n = 32
    kernels.batch_terms(obj, scan.guess, scan.top_left[:n], scan.amplitudes[:n])  # warm
    tracemalloc.start()
    terms = kernels.batch_terms(obj, scan.guess, scan.top_left[:n], scan.amplitudes[:n])
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    region = terms.grad_obj.nbytes
    modelled = n * 64 * 64 * SCRATCH_PER_PIXEL + region
    assert 0.8 <= modelled / peak <= 1.5, (modelled, peak)


@pytest.mark.gpu
def test_cupy_terms_and_update_match_numpy(problem):
    import cupy

    obj, probe, top_left, measured = (np.asarray(a) for a in problem)
    obj, probe = obj.astype(np.complex64), probe.astype(np.complex64)
    measured = measured.astype(np.float32)
    host = kernels.batch_terms(obj, probe, top_left, measured)
    device = kernels.batch_terms(cupy.asarray(obj), cupy.asarray(probe), top_left,
                                 cupy.asarray(measured))
    assert device.loss == pytest.approx(host.loss, rel=1e-5)
    np.testing.assert_allclose(device.grad_obj.get(), host.grad_obj, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(device.grad_probe.get(), host.grad_probe, rtol=1e-4, atol=1e-4)
    new_host = kernels.update(obj, probe, host, top_left, step_obj=1, step_probe=1, alpha=0.1)
    new_device = kernels.update(cupy.asarray(obj), cupy.asarray(probe), device, top_left,
                                step_obj=1, step_probe=1, alpha=0.1)
    for h, d in zip(new_host, new_device, strict=True):
        np.testing.assert_allclose(d.get(), h, atol=1e-5)
