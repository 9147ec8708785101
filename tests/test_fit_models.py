"""Dipole models: Jacobians against finite differences, conventions, starts, simulated catalogs."""

from __future__ import annotations

import numpy as np
import pytest

from outcore.fit.models import (
    cubic_kernel,
    gaussian_evaluate,
    get_model,
    moment_start,
    psf_evaluate,
)
from outcore.fit.simulate import moffat_psf, simulate_catalog

RNG = np.random.default_rng(11)


def _gaussian_params(n: int) -> np.ndarray:
    return np.column_stack([
        RNG.uniform(-3, 3, n), RNG.uniform(-3, 3, n), RNG.uniform(-3, 3, n),
        RNG.uniform(-3, 3, n), RNG.uniform(100, 900, n), -RNG.uniform(100, 900, n),
        RNG.uniform(0.8, 2.5, n), RNG.uniform(-5, 5, n),
    ])


def _finite_difference(evaluate, params: np.ndarray, shape, *extra, h: float = 1e-6):
    out = np.empty((*evaluate(params, shape, *extra).shape, params.shape[1]))
    for j in range(params.shape[1]):
        step = np.zeros(params.shape[1])
        step[j] = h * np.maximum(1.0, np.abs(params[:, j])).max()
        out[..., j] = (evaluate(params + step, shape, *extra)
                       - evaluate(params - step, shape, *extra)) / (2 * step[j])
    return out


@pytest.mark.parametrize("shape", [(17, 17), (15, 21)])
def test_gaussian_jacobian_matches_finite_differences(shape):
    params = _gaussian_params(6)
    spec = get_model("gaussian")
    jac = spec.jacobian(params, shape)
    assert jac.shape == (6, *shape, 8)
    fd = _finite_difference(spec.evaluate, params, shape)
    for j in range(8):
        scale = np.abs(jac[..., j]).max()
        assert np.abs(jac[..., j] - fd[..., j]).max() <= 1e-6 * scale, spec.params[j]


@pytest.mark.parametrize("per_candidate", [False, True])
def test_psf_jacobian_matches_finite_differences(per_candidate):
    params = _gaussian_params(5)[:, [0, 1, 2, 3, 4, 5, 7]]
    psf = moffat_psf((13, 15), fwhm=2.5)
    if per_candidate:
        psf = np.stack([moffat_psf((13, 15), fwhm=f) for f in np.linspace(2, 4, 5)])
    spec = get_model("psf")
    jac = spec.jacobian(params, (17, 19), psf)
    assert jac.shape == (5, 17, 19, 7)
    fd = _finite_difference(spec.evaluate, params, (17, 19), psf)
    for j in range(7):
        scale = np.abs(jac[..., j]).max()
        assert np.abs(jac[..., j] - fd[..., j]).max() <= 1e-6 * scale, spec.params[j]


def test_cubic_kernel_keeps_flux_and_is_keys():
    t = np.linspace(-2.5, 2.5, 1001)
    w, _ = cubic_kernel(t)
    a = np.abs(t)
    keys = np.where(a <= 1, 1.5 * a**3 - 2.5 * a**2 + 1,
                    np.where(a < 2, -0.5 * a**3 + 2.5 * a**2 - 4 * a + 2, 0.0))
    np.testing.assert_allclose(w, keys, atol=1e-14)
    for shift in (0.0, 0.25, 0.5, 0.9):
        weights, slopes = cubic_kernel(np.arange(-3, 4) - shift)
        assert weights.sum() == pytest.approx(1.0, abs=1e-14)
        assert slopes.sum() == pytest.approx(0.0, abs=1e-14)


def test_conventions_pixel_centres_x_last_axis_flux_is_integral():
    params = np.array([[2.0, -1.0, -3.0, 1.0, 1000.0, -400.0, 1.5, 0.0]])
    image = gaussian_evaluate(params, (41, 41))[0]
    assert np.unravel_index(image.argmax(), image.shape) == (20 - 1, 20 + 2)  # (y, x)
    assert np.unravel_index(image.argmin(), image.shape) == (20 + 1, 20 - 3)
    only_pos = params.copy()
    only_pos[0, 5] = 0.0
    assert gaussian_evaluate(only_pos, (41, 41)).sum() == pytest.approx(1000.0, rel=1e-9)
    psf_params = np.array([[1.3, -0.6, -2.0, 2.0, 700.0, 0.0, 3.0]])
    stamp = psf_evaluate(psf_params, (31, 31), moffat_psf((15, 15)))
    assert stamp.sum() == pytest.approx(700.0 + 3.0 * 31 * 31, rel=1e-12)
    # an even-sized stamp has its centre between pixels
    centred = gaussian_evaluate(np.array([[0.0, 0, 5, 5, 100, 0, 1, 0]]), (16, 16))[0]
    np.testing.assert_allclose(centred[7:9, 7:9], centred[7, 7])


def test_moment_start_lands_near_a_clean_dipole():
    params = np.array([[1.8, 0.4, -1.7, -0.6, 1500.0, -1200.0, 1.4, 3.0]])
    image = gaussian_evaluate(params, (17, 17))
    start = moment_start(image, np.ones(image.shape, dtype=bool))[0]
    assert np.hypot(*(start[:2] - params[0, :2])) < 0.5
    assert np.hypot(*(start[2:4] - params[0, 2:4])) < 0.5
    assert start[4] > 0 > start[5]
    assert 0.5 < start[6] < 3.0
    assert start[7] == pytest.approx(3.0, abs=0.1)


def test_simulated_catalog_is_reproducible_and_chunk_independent():
    big, big_truth = simulate_catalog(1100, seed=4, mask_fraction=0.05, noise="poisson")
    small, small_truth = simulate_catalog(50, seed=4, mask_fraction=0.05, noise="poisson",
                                          chunk_size=7)
    assert big.attrs["outcore_layout"] == "cutouts"
    assert big.images.dims == ("candidate", "y", "x") and big.images.shape == (1100, 17, 17)
    assert big.candidate_id.dtype == np.int64
    assert big.mask.dtype == bool
    head = big.isel(candidate=slice(0, 50)).compute()
    small = small.compute()
    for name in ("images", "variance", "mask"):
        np.testing.assert_array_equal(head[name].values, small[name].values)
    assert big_truth.isel(candidate=slice(0, 50)).identical(small_truth)
    other, _ = simulate_catalog(50, seed=5)
    assert not np.array_equal(other.images.values, small.images.values)
    assert (big_truth.separation >= 3).all() and (big_truth.separation <= 6).all()
    assert (big_truth.flux_neg < 0).all() and (big_truth.flux_pos > 0).all()


def test_simulated_psf_catalog_carries_its_psf():
    catalog, truth = simulate_catalog(20, 15, seed=1, model="psf")
    assert catalog.psf.dims == ("psf_y", "psf_x")
    assert float(catalog.psf.sum()) == pytest.approx(1.0)
    assert "sigma" not in truth
    with pytest.raises(ValueError, match="psf"):
        simulate_catalog(5, psf=moffat_psf())
