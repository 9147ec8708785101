"""The far-field model (``reconstruct.model``) against a forward model written from first
principles, its gradients (object slices, probe modes, positions) against finite differences,
the update's algebra, the scratch model against tracemalloc, the compiled host kernels
against their array code, and every function of ``kernels.gpu`` against its twin of the same
name in ``kernels.cpu``."""

from __future__ import annotations

import numpy as np
import pytest

from outcore.ptycho import kernels
from outcore.ptycho.memory import scratch_per_pixel
from outcore.ptycho.reconstruction import model as physics
from outcore.ptycho.reconstruction.model import Model

from .ptycho_cases import aperture_probe, assert_gradients_match, true_scan


@pytest.fixture(scope="module")
def problem():
    """Two slices, three probe modes, sub-pixel positions, a detector mask."""
    rng = np.random.default_rng(3)
    k, n = 16, 40
    obj = rng.uniform(0.5, 1, (2, n, n)) * np.exp(1j * rng.uniform(-1, 1, (2, n, n)))
    base = aperture_probe(k, 5, 0.1).astype(np.complex128)
    y = (np.arange(k) - k // 2)[:, None] / k
    probe = np.stack([base, base * y, base * y.T * 0.5])
    coords = np.array([[r, c] for r in range(2, n - k - 2, 4) for c in range(2, n - k - 2, 4)],
                      float)
    coords += rng.uniform(-0.45, 0.45, coords.shape)
    q = np.fft.fftfreq(k)
    propagator = np.exp(-1j * 2.0 * (q[:, None] ** 2 + q[None, :] ** 2))
    valid = rng.random((k, k)) > 0.1
    return obj, probe, coords, propagator, valid


def _measured(problem, model):
    obj, probe, coords, _, _ = problem
    return np.sqrt(physics.intensities(obj, probe, coords, model)) * 1.1 + 0.01


@pytest.mark.parametrize("noise", ["amplitude", "poisson"])
def test_gradients_match_finite_differences(problem, noise):
    """dL/d(object slices), dL/d(probe modes) and dL/d(positions) against central
    differences of the loss, on a two-slice object, three modes, a mask, sub-pixel
    positions."""
    obj, probe, coords, propagator, valid = problem
    model = Model(noise, valid, propagator)
    assert_gradients_match(obj, probe, coords, _measured(problem, model), model,
                           np.random.default_rng(1), draws=8)


def test_position_curvature_gives_the_gauss_newton_step():
    """On noise-free data the Gauss-Newton step of a position moved by (0.4, -0.3) pixels
    brings it back to within 0.05 pixel."""
    from outcore.ptycho.reconstruction.solver import gauss_newton

    scan = true_scan(side=3, k=32, step=6, seed=2)
    corners = scan.corners()
    moved = corners + np.array([0.4, -0.3])
    terms = physics.batch_terms(scan.slices[0], scan.probes(), moved, scan.amplitudes(),
                                index=np.arange(len(moved)))
    back = moved + gauss_newton(terms.grad_pos, terms.curv_pos)
    assert np.abs(back - corners).max() < 0.05


def test_forward_model_matches_first_principles():
    """``model.intensities`` (Fourier-shifted probe, modes, Fresnel between slices) against
    the scan of ``ptycho_cases.true_scan``: direct sums of each probe's pupil at its exact
    position, no shared code."""
    scan = true_scan(side=3, k=32, step=5, jitter=0.5, modes=(1, 0.5, 0.3), slices=2,
                     thickness=0.02, seed=4)
    q = np.fft.fftfreq(scan.k) * scan.k
    propagator = np.exp(-1j * scan.thickness * (q[:, None] ** 2 + q[None, :] ** 2))
    model = Model(propagator=propagator)
    ours = physics.intensities(np.stack(scan.slices), scan.probes(), scan.corners(), model)
    assert np.abs(scan.corners() % 1).max() > 0.1  # sub-pixel indeed
    np.testing.assert_allclose(ours, scan.counts, rtol=1e-4, atol=1e-5 * scan.counts.max())


def test_masked_pixels_change_nothing(problem):
    obj, probe, coords, propagator, valid = problem
    model = Model("amplitude", valid, propagator)
    measured = _measured(problem, model)
    spoiled = measured.copy()
    spoiled[:, ~valid] = 1e3
    a, b = (physics.batch_terms(obj, probe, coords, m, model) for m in (measured, spoiled))
    assert a.loss == b.loss
    np.testing.assert_array_equal(a.grad_obj, b.grad_obj)
    np.testing.assert_array_equal(a.grad_probe, b.grad_probe)


def test_terms_of_parts_add_up_to_the_whole(problem):
    obj, probe, coords, propagator, valid = problem
    model = Model("amplitude", valid, propagator)
    measured = _measured(problem, model)
    index = np.arange(len(coords))
    whole = physics.batch_terms(obj, probe, coords, measured, model, index=index)
    parts = [physics.batch_terms(obj, probe, coords[s], measured[s], model, index=index[s])
             for s in (slice(0, 5), slice(5, 9), slice(9, None))]
    summed = parts[0] + parts[1] + parts[2]
    assert summed.loss == pytest.approx(whole.loss, rel=1e-12)
    np.testing.assert_allclose(summed.full_grad_obj(obj.shape), whole.full_grad_obj(obj.shape),
                               rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(summed.grad_probe, whole.grad_probe, rtol=1e-12)
    np.testing.assert_array_equal(summed.index, index)
    np.testing.assert_allclose(summed.grad_pos, whole.grad_pos, rtol=1e-12)
    np.testing.assert_allclose(summed.curv_pos, whole.curv_pos, rtol=1e-12)
    assert summed.count == len(coords)


def test_one_position_step_is_the_modulus_projection(problem):
    """alpha = 0, step 1, one window: the new exit wave's far field has the measured
    amplitude exactly (the probe is non-zero everywhere on its window)."""
    obj = problem[0][0]
    one = np.array([[8, 4]])
    measured = np.abs(np.random.default_rng(0).normal(size=(1, 16, 16))) + 0.1
    gaussian = np.exp(-((np.mgrid[:16, :16] - 8) ** 2).sum(0) / 30).astype(np.complex128)
    terms = physics.batch_terms(obj, gaussian, one, measured)
    new_obj, _ = physics.update(obj, gaussian, terms, one, step_obj=1.0, step_probe=0.0,
                                alpha=0.0)
    far = np.abs(physics.farfield(new_obj, gaussian, one))[:, 0]
    np.testing.assert_allclose(far, measured, rtol=1e-9, atol=1e-9)
    untouched = np.ones(obj.shape, bool)
    untouched[8:24, 4:20] = False
    np.testing.assert_array_equal(new_obj[untouched], obj[untouched])


def test_farfield_is_centred_and_unitary():
    """A flat object under a flat probe sends all its energy to the centre pixel K//2."""
    k = 8
    far = physics.farfield(np.ones((k, k), np.complex64), np.ones((k, k), np.complex64),
                           np.zeros((1, 2), int))[0, 0]
    assert abs(far[k // 2, k // 2]) == pytest.approx(k, rel=1e-6)
    assert (abs(far) ** 2).sum() == pytest.approx(k * k, rel=1e-6)


def test_a_whole_pixel_shift_moves_the_window():
    """Coordinates one pixel further cut the next window: the same patterns as the object
    rolled back by one pixel."""
    rng = np.random.default_rng(4)
    obj = np.exp(1j * rng.uniform(-1, 1, (40, 40)))
    probe = aperture_probe(16, 5, 0.1)
    corners = np.array([[5.0, 5.0], [10.3, 12.4]])
    moved = physics.intensities(obj, probe, corners + [0, 1])
    rolled = physics.intensities(np.roll(obj, -1, axis=1), probe, corners)
    np.testing.assert_allclose(moved, rolled, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("modes, slices, subpixel, refine",
                         [(1, 1, False, False), (1, 1, True, False), (3, 1, True, False),
                          (1, 2, True, False), (2, 2, True, True)])
def test_scratch_model_bounds_tracemalloc(modes, slices, subpixel, refine):
    """The memory model's scratch per position against tracemalloc's peak of a real call."""
    import tracemalloc

    rng = np.random.default_rng(0)
    k, n, size = 64, 32, 160
    obj = np.exp(1j * rng.uniform(0, 1, (slices, size, size))).astype(np.complex64)
    probe = (rng.normal(size=(modes, k, k)) + 1j * rng.normal(size=(modes, k, k))).astype(
        np.complex64)
    coords = rng.uniform(0, size - k - 1, (n, 2))
    coords = coords if subpixel else np.floor(coords)
    amplitudes = rng.uniform(0, 1, (n, k, k)).astype(np.float32)
    q = np.fft.fftfreq(k)
    model = Model(propagator=np.exp(-1j * (q[:, None] ** 2 + q[None, :] ** 2)).astype(
        np.complex64) if slices > 1 else None)
    index = np.arange(n) if refine else None
    physics.batch_terms(obj, probe, coords, amplitudes, model, index=index)  # warm
    tracemalloc.start()
    terms = physics.batch_terms(obj, probe, coords, amplitudes, model, index=index)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    modelled = n * k * k * scratch_per_pixel(modes, slices, subpixel, refine) \
        + terms.grad_obj.nbytes
    assert 0.8 <= modelled / peak <= 1.5, (modelled, peak)


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
def test_compiled_host_ops_match_their_array_code(dtype):
    """``kernels.cpu``'s compiled loops against ``kernels.arrays`` (cupy's path) on numpy: the
    same exit waves, losses, factors, backward slice, curvatures, unshifted sums and object steps,
    with two modes, a mask, both losses, a shared and a per-position incident wave, one and
    per-slice illuminations."""
    from outcore.ptycho.kernels import arrays, cpu

    rng = np.random.default_rng(5)
    n, modes, k = 6, 2, 12

    def noise(*shape):
        return (rng.normal(size=shape) + 1j * rng.normal(size=shape)).astype(dtype)

    layer, top_left = noise(30, 34), rng.integers(0, 30 - k, (n, 2))
    for waves in (noise(1, modes, k, k), noise(n, modes, k, k)):
        np.testing.assert_array_equal(cpu.exit_waves(layer, top_left, waves),
                                      arrays.exit_waves(layer, top_left, waves, cpu.windows))
    far, amplitudes = noise(n, modes, k, k), rng.uniform(0, 2, (n, k, k)).astype(np.float32)
    amplitudes[0, 0, 0] = 0  # a zero count for the Poisson loss
    valid = rng.random((k, k)) > 0.2
    tol = {"rtol": 1e-5 if dtype == np.complex64 else 1e-12}
    for mask in (None, valid):
        for poisson in (False, True):
            ours, theirs = far.copy(), far.copy()
            loss = cpu.residual(ours, amplitudes, mask, poisson, physics.TINY)
            assert loss == pytest.approx(arrays.residual(theirs, amplitudes, mask, poisson,
                                                         physics.TINY), rel=tol["rtol"])
            np.testing.assert_allclose(ours, theirs, atol=1e-5 * np.abs(theirs).max(), **tol)
        d_y, d_x = noise(n, modes, k, k), noise(n, modes, k, k)
        np.testing.assert_allclose(cpu.curvature(far, d_y, d_x, mask, physics.TINY),
                                   arrays.curvature(far, d_y, d_x, mask, physics.TINY), **tol)
    for incident in (noise(1, modes, k, k), noise(n, modes, k, k)):
        local = top_left - top_left.min(axis=0)
        results = []
        for back in (cpu.back_layer, lambda *a: arrays.back_layer(*a, cpu.windows,
                                                                   cpu.scatter_add)):
            chi = far.copy()
            grad = np.zeros((30, 34), np.complex128)
            illum, probe_sum = np.zeros((k, k)), np.zeros((modes, k, k), np.complex128)
            back(chi, layer, top_left, incident, grad, local, illum, probe_sum)
            results.append((chi, grad, illum, probe_sum))
        for ours, theirs in zip(*results, strict=True):
            np.testing.assert_allclose(ours, theirs, atol=1e-6 * np.abs(theirs).max(), **tol)
    ramps, probe_hat = noise(n, k, k), noise(modes, k, k)
    for positions in (False, True):
        ours, theirs = (f(far, probe_hat, ramps, positions) for f in (cpu.unshift,
                                                                       arrays.unshift))
        np.testing.assert_allclose(ours[0], theirs[0], **tol)
        if positions:
            np.testing.assert_allclose(ours[1], theirs[1], atol=1e-5 * np.abs(theirs[1]).max())
        else:
            assert ours[1] is None and theirs[1] is None
    grad = noise(2, 9, 11).astype(np.complex128)
    for illumination in (rng.uniform(0, 3, (1, 9, 11)), rng.uniform(0, 3, (2, 9, 11))):
        np.testing.assert_allclose(
            cpu.object_step(grad, illumination, 0.3, 0.05, physics.TINY, dtype),
            arrays.object_step(grad, illumination, 0.3, 0.05, physics.TINY, dtype), **tol)


def test_rounding_errors_off_the_pixel_grid_count_as_whole_pixels():
    """Positions stored in metres come back about 1e-14 pixel off the grid: they take the
    whole-pixel path (no Fourier shift, half the FFTs) and give the exact integers' terms,
    while a real sub-pixel offset (1e-6 pixel) is still shifted."""
    rng = np.random.default_rng(6)
    obj = np.exp(1j * rng.uniform(-1, 1, (40, 40))).astype(np.complex64)
    probe = aperture_probe(16, 5, 0.1).astype(np.complex64)
    corners = np.array([[3.0, 5.0], [11.0, 20.0]])
    measured = np.ones((2, 16, 16), np.float32)
    noisy = corners * (1 + 1e-15) + np.array([[3e-14, -2e-14], [0.0, 1e-13]])
    assert np.any(noisy != corners)
    assert physics.forward(obj, probe, noisy).ramps is None
    assert not physics.subpixel(noisy) and physics.subpixel(corners + 1e-6)
    assert physics.forward(obj, probe, corners + 1e-6).ramps is not None
    exact, rounded = (physics.batch_terms(obj, probe, c, measured) for c in (corners, noisy))
    assert exact.loss == rounded.loss
    np.testing.assert_array_equal(exact.grad_obj, rounded.grad_obj)
    np.testing.assert_array_equal(exact.grad_probe, rounded.grad_probe)


def test_windows_outside_the_image_are_refused():
    """The compiled loops do not check their indices: ``kernels`` refuses such windows
    first."""
    image = np.zeros((20, 20), np.complex64)
    with pytest.raises(ValueError, match="leave the 20x20 image"):
        kernels.windows(image, np.array([[0, 0], [13, 2]]), 8)
    with pytest.raises(ValueError, match="leave the 20x20 image"):
        kernels.exit_waves(image, np.array([[-1, 0]]), np.ones((1, 1, 8, 8), np.complex64))


@pytest.mark.gpu
def test_cupy_kernels_match_their_numpy_twins():
    import cupy

    rng = np.random.default_rng(2)
    image = (rng.normal(size=(40, 50)) + 1j * rng.normal(size=(40, 50))).astype(np.complex64)
    top_left = np.array([[0, 0], [3, 7], [20, 30], [3, 7]])
    cut = kernels.windows(image, top_left, 8)
    np.testing.assert_array_equal(kernels.windows(cupy.asarray(image), top_left, 8).get(), cut)
    host = np.zeros((40, 50), np.complex128)
    device = cupy.zeros((40, 50), cupy.complex128)
    kernels.scatter_add(host, top_left, cut.astype(np.complex128))
    kernels.scatter_add(device, top_left, cupy.asarray(cut, cupy.complex128))
    np.testing.assert_allclose(device.get(), host, rtol=1e-12)


@pytest.mark.gpu
@pytest.mark.parametrize("noise", ["amplitude", "poisson"])
def test_cupy_terms_and_update_match_numpy(problem, noise):
    import cupy

    obj, probe, coords, propagator, valid = problem
    obj, probe = obj.astype(np.complex64), probe.astype(np.complex64)
    model = Model(noise, valid, propagator.astype(np.complex64))
    measured = _measured(problem, model).astype(np.float32)
    index = np.arange(len(coords))
    host = physics.batch_terms(obj, probe, coords, measured, model, index=index)
    device = physics.batch_terms(cupy.asarray(obj), cupy.asarray(probe), coords,
                                 cupy.asarray(measured), model.on(cupy), index=index)
    assert device.loss == pytest.approx(host.loss, rel=1e-5)
    np.testing.assert_allclose(device.grad_obj.get(), host.grad_obj, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(device.grad_probe.get(), host.grad_probe, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(device.grad_pos, host.grad_pos, rtol=1e-3, atol=1e-5)
    new_host = physics.update(obj, probe, host, coords, step_obj=1, step_probe=1, alpha=0.1)
    new_device = physics.update(cupy.asarray(obj), cupy.asarray(probe), device, coords,
                                step_obj=1, step_probe=1, alpha=0.1)
    for h, d in zip(new_host, new_device, strict=True):
        np.testing.assert_allclose(d.get(), h, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
def test_every_gpu_kernel_matches_its_cpu_twin(dtype):
    """Each function of ``kernels.gpu`` against its twin of the same name in ``kernels.cpu``,
    on the same inputs (copied to the device): ``gpu.fft``, ``gpu.windows``,
    ``gpu.scatter_add``, ``gpu.exit_waves``, ``gpu.residual``, ``gpu.back_layer``,
    ``gpu.curvature``, ``gpu.unshift``, ``gpu.object_step`` and ``gpu.staged``; with two
    modes, a mask and none, both losses, a shared and a per-position incident wave, one and
    per-slice illuminations."""
    import cupy

    from outcore.ptycho.kernels import cpu, gpu

    rng = np.random.default_rng(7)
    n, modes, k = 6, 2, 12
    rtol = 1e-4 if dtype == np.complex64 else 1e-10
    on = cupy.asarray

    def noise(*shape):
        return (rng.normal(size=shape) + 1j * rng.normal(size=shape)).astype(dtype)

    def close(device, host):
        host = np.asarray(host)
        np.testing.assert_allclose(cupy.asnumpy(device), host, rtol=rtol,
                                   atol=rtol * max(float(np.abs(host).max()), 1.0))

    frames = noise(n, k, k)
    close(gpu.fft().fft2(on(frames)), cpu.fft().fft2(frames))
    close(gpu.fft().ifft2(on(frames), norm="forward"), cpu.fft().ifft2(frames, norm="forward"))
    layer, top_left = noise(30, 34), rng.integers(0, 30 - k, (n, 2))
    np.testing.assert_array_equal(gpu.windows(on(layer), top_left, k).get(),
                                  cpu.windows(layer, top_left, k))
    for values in (noise(n, k, k).astype(np.complex128), noise(1, k, k).astype(np.complex128),
                   rng.uniform(0, 2, (n, k, k))):
        host = np.zeros((30, 34), values.dtype)
        device = cupy.zeros((30, 34), values.dtype)
        cpu.scatter_add(host, top_left, values)
        gpu.scatter_add(device, top_left, on(values))
        close(device, host)
    for waves in (noise(1, modes, k, k), noise(n, modes, k, k)):
        close(gpu.exit_waves(on(layer), top_left, on(waves)),
              cpu.exit_waves(layer, top_left, waves))
    far, amplitudes = noise(n, modes, k, k), rng.uniform(0, 2, (n, k, k)).astype(np.float32)
    amplitudes[0, 0, 0] = 0  # a zero count for the Poisson loss
    valid = rng.random((k, k)) > 0.2
    for mask in (None, valid):
        for poisson in (False, True):
            host, device = far.copy(), on(far)
            loss = cpu.residual(host, amplitudes, mask, poisson, physics.TINY)
            assert gpu.residual(device, on(amplitudes), None if mask is None else on(mask),
                                poisson, physics.TINY) == pytest.approx(loss, rel=rtol)
            close(device, host)
        d_y, d_x = noise(n, modes, k, k), noise(n, modes, k, k)
        close(gpu.curvature(on(far), on(d_y), on(d_x), None if mask is None else on(mask),
                            physics.TINY),
              cpu.curvature(far, d_y, d_x, mask, physics.TINY))
    local = top_left - top_left.min(axis=0)
    for incident in (noise(1, modes, k, k), noise(n, modes, k, k)):
        for sums in (True, False):
            host = [far.copy(), np.zeros((30, 34), np.complex128), np.zeros((k, k)),
                    np.zeros((modes, k, k), np.complex128)]
            device = [on(a) for a in host]
            if not sums:
                host[2:] = device[2:] = [None, None]
            cpu.back_layer(host[0], layer, top_left, incident, host[1], local, *host[2:])
            gpu.back_layer(device[0], on(layer), top_left, on(incident), device[1], local,
                           *device[2:])
            for d, h in zip(device, host, strict=True):
                if h is not None:
                    close(d, h)
    ramps, probe_hat = noise(n, k, k), noise(modes, k, k)
    for positions in (False, True):
        device = gpu.unshift(on(far), on(probe_hat), on(ramps), positions)
        host = cpu.unshift(far, probe_hat, ramps, positions)
        close(device[0], host[0])
        if positions:
            close(device[1], host[1])
        else:
            assert device[1] is None and host[1] is None
    grad = noise(2, 9, 11).astype(np.complex128)
    for illumination in (rng.uniform(0, 3, (1, 9, 11)), rng.uniform(0, 3, (2, 9, 11))):
        close(gpu.object_step(on(grad), on(illumination), 0.3, 0.05, physics.TINY, dtype),
              cpu.object_step(grad, illumination, 0.3, 0.05, physics.TINY, dtype))
    staged = rng.uniform(0, 1, (n, k, k)).astype(np.float32)
    assert cpu.staged(staged) is staged
    np.testing.assert_array_equal(gpu.staged(staged), staged)
