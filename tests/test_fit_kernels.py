"""The batched Levenberg-Marquardt kernel against independent truths: scipy, simulated truth,
per-candidate bad input, statuses, its memory model; the host's compiled loop against the
array code, and the cupy twin (``kernels/gpu.py``) against the host twin (``kernels/cpu.py``)."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from scipy.optimize import least_squares

from outcore.fit.kernels import cpu, fit_chunk, fit_columns, unpack
from outcore.fit.kernels.lm import STATUS, STATUS_NAMES
from outcore.fit.memory import memory_model
from outcore.fit.models import get_model
from outcore.fit.simulate import simulate_catalog

TIGHT = {"f_tol": 1e-15, "x_tol": 1e-15, "g_tol": 1e-15, "max_iterations": 500}


def _catalog(n: int, model: str = "gaussian", **kwargs):
    catalog, truth = simulate_catalog(n, seed=kwargs.pop("seed", 7), model=model, **kwargs)
    catalog = catalog.compute()
    arrays = {"images": catalog.images.values, "variance": catalog.variance.values}
    if "mask" in catalog:
        arrays["mask"] = catalog.mask.values
    if model == "psf":
        arrays["psf"] = catalog.psf.values
    return arrays, truth


def _scipy_fit(model: str, image, variance, mask, psf):
    """scipy's MINPACK LM on the same model, start (from the kernel's own start) and weights."""
    spec = get_model(model)
    shape = image.shape
    valid = ~mask
    sqrtw = np.where(valid, 1 / np.sqrt(variance), 0.0)[valid]
    extra = (psf,) if spec.needs_psf else ()
    start = spec.start(np.where(valid, image, 0.0)[None], valid[None])[0]

    def resid(p):
        return sqrtw * (image[valid] - spec.evaluate(p[None], shape, *extra)[0][valid])

    def jac(p):
        return -sqrtw[:, None] * spec.jacobian(p[None], shape, *extra)[0][valid]

    fit = least_squares(resid, start, jac=jac, method="lm", ftol=1e-15, xtol=1e-15, gtol=1e-15,
                        max_nfev=10_000)
    errors = np.sqrt(np.diag(np.linalg.inv(fit.jac.T @ fit.jac)))
    params = spec.canonical(fit.x[None].copy())[0]
    return params, errors, 2 * fit.cost


@pytest.mark.parametrize(("model", "n"), [("gaussian", 20), ("psf", 10)])
def test_same_fit_as_scipy_least_squares(model, n):
    arrays, _ = _catalog(n, model, mask_fraction=0.03, noise="poisson", background=(-2.0, 2.0))
    ours = unpack(fit_chunk(**arrays, model=model, **TIGHT), model)
    names = get_model(model).params
    assert set(ours["status"]) <= {STATUS["converged_f_tol"], STATUS["converged_x_tol"],
                                   STATUS["converged_g_tol"]}
    for i in range(n):
        params, errors, chi2 = _scipy_fit(model, arrays["images"][i], arrays["variance"][i],
                                          arrays["mask"][i], arrays.get("psf"))
        mine = np.array([ours[name][i] for name in names])
        np.testing.assert_allclose(mine, params, rtol=1e-5, atol=1e-8)
        np.testing.assert_allclose([ours[f"{name}_err"][i] for name in names], errors,
                                   rtol=1e-4)
        assert ours["chi2"][i] == pytest.approx(chi2, rel=1e-8)


@pytest.mark.parametrize("model", ["gaussian", "psf"])
def test_unbiased_with_unit_pulls_on_simulated_dipoles(model):
    n = 1500
    arrays, truth = _catalog(n, model, seed=21, separation=(3.0, 6.0), snr=(20.0, 100.0))
    fits = unpack(fit_chunk(**arrays, model=model), model)
    assert (fits["status"] <= STATUS["converged_g_tol"]).all()
    for name in ("x_pos", "y_pos", "x_neg", "y_neg", "flux_pos", "flux_neg"):
        pull = (fits[name] - truth[name].values) / fits[f"{name}_err"]
        sem = pull.std() / np.sqrt(n)
        assert abs(pull.mean()) < 3 * sem, (name, pull.mean(), sem)
        assert 0.9 < pull.std() < 1.1, (name, pull.std())
    reduced = fits["chi2"] / fits["dof"]
    assert reduced.mean() == pytest.approx(1.0, abs=0.02)


def test_bad_candidates_are_flagged_and_leave_the_others_untouched():
    arrays, _ = _catalog(30, mask_fraction=0.05)
    clean = fit_chunk(**arrays)
    images, variance, mask = (arrays[k].copy() for k in ("images", "variance", "mask"))
    images[3, 8, 8] = np.nan
    variance[7, 2, 5] = 0.0
    mask[7, 2, 5] = False
    mask[11] = True
    mask[21] = True
    mask[21, 0, :5] = False  # 5 unmasked pixels < 8 parameters
    images[15][mask[15]] = np.inf  # bad values under the mask are ignored
    variance[19][mask[19]] = -1.0
    dirty = fit_chunk(images, variance, mask)
    out = unpack(dirty, "gaussian")
    bad = [3, 7, 11, 21]
    assert [STATUS_NAMES[s] for s in out["status"][bad]] == ["invalid_input"] * 4
    assert np.isnan(dirty[bad, :17]).all()
    assert (out["iterations"][bad] == 0).all()
    assert out["dof"][11] == -8 and out["dof"][21] == 5 - 8
    keep = np.setdiff1d(np.arange(30), bad)
    np.testing.assert_array_equal(dirty[keep], clean[keep])


def test_a_blank_stamp_is_singular_and_breaks_nothing():
    arrays, _ = _catalog(6)
    images = arrays["images"].copy()
    images[2] = 0.0
    out = fit_chunk(images, arrays["variance"])
    assert STATUS_NAMES[int(out[2, -1])] == "singular"
    assert np.isnan(out[2, 8:16]).all()
    np.testing.assert_array_equal(np.delete(out, 2, axis=0),
                                  np.delete(fit_chunk(**arrays), 2, axis=0))


def test_each_stopping_rule_reports_its_status():
    arrays, _ = _catalog(12)
    by_gradient = unpack(fit_chunk(**arrays, g_tol=1.0), "gaussian")  # cosines never exceed 1
    assert (by_gradient["status"] == STATUS["converged_g_tol"]).all()
    assert (by_gradient["iterations"] == 0).all()
    by_step = unpack(fit_chunk(**arrays, f_tol=0.0, g_tol=0.0, x_tol=1e-3), "gaussian")
    assert (by_step["status"] == STATUS["converged_x_tol"]).all()
    capped = unpack(fit_chunk(**arrays, max_iterations=2, f_tol=0.0, x_tol=0.0, g_tol=0.0),
                    "gaussian")
    assert (capped["status"] == STATUS["max_iterations"]).all()
    assert (capped["iterations"] == 2).all()
    default = unpack(fit_chunk(**arrays), "gaussian")
    assert (default["status"] == STATUS["converged_f_tol"]).all()


def test_weights_and_error_scaling():
    arrays, _ = _catalog(8, noise_variance=1.0)
    unit = fit_chunk(arrays["images"])
    np.testing.assert_array_equal(unit, fit_chunk(arrays["images"], np.ones((8, 17, 17))))
    scaled = unpack(fit_chunk(arrays["images"], scale_errors=True), "gaussian")
    plain = unpack(unit, "gaussian")
    factor = np.sqrt(plain["chi2"] / plain["dof"])
    np.testing.assert_allclose(scaled["x_pos_err"], plain["x_pos_err"] * factor, rtol=1e-12)
    assert fit_columns("psf")[-4:] == ("chi2", "dof", "iterations", "status")


@pytest.mark.parametrize("model", ["gaussian", "psf"])
def test_memory_model_matches_the_measured_peak(model):
    n = 256
    arrays, _ = _catalog(n, model, mask_fraction=0.02, dtype="float32")
    fit_chunk(**{k: v[:4] if v.ndim == 3 else v for k, v in arrays.items()}, model=model)
    tracemalloc.start()
    try:
        fit_chunk(**arrays, model=model)
        _, measured = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    psf_shape = arrays["psf"].shape if model == "psf" else None
    fit, columns = memory_model(10 * n, n, (17, 17), "float32", model, mask=True,
                                psf_shape=psf_shape)
    assert fit.tasks == 10 and columns.tasks == 10
    assert fit.input_bytes == n * 17 * 17 * (4 + 4 + 1)
    projected = fit.transient_bytes + fit.output_bytes
    assert 0.8 <= projected / measured <= 1.5, (projected, measured)


def test_compiled_host_loop_equals_the_array_code(monkeypatch):
    """The Gaussian model's compiled loop (kernels/compiled.py) against the batched array code
    on the same numpy chunk: every status, iteration count, parameter and error."""
    arrays, _ = _catalog(400, mask_fraction=0.05, noise="poisson", background=(-2.0, 2.0),
                         seed=31)
    arrays["images"][3] = 0.0  # blank: singular
    arrays["images"][5, 4, 4] = np.nan  # invalid_input
    arrays["mask"][9, :, :] = True  # fully masked: invalid_input
    arrays["mask"][11, 1:-1, 1:-1] = True  # border only: the start's medians from the border
    arrays["mask"][12, 0, :] = arrays["mask"][12, -1, :] = True  # no border row: fallback
    arrays["mask"][12, :, 0] = arrays["mask"][12, :, -1] = True
    for options in ({}, {"max_iterations": 3}, {"g_tol": 0.1}, {"scale_errors": True}, TIGHT):
        compiled = unpack(fit_chunk(**arrays, **options), "gaussian")
        with monkeypatch.context() as patch:
            patch.setattr(cpu, "COMPILED_MODELS", ())
            array_code = unpack(fit_chunk(**arrays, **options), "gaussian")
        if options is TIGHT:  # steps of 1e-15: rounding decides the last few, not the fit
            converged = STATUS["converged_g_tol"]
            np.testing.assert_array_equal(compiled["status"] <= converged,
                                          array_code["status"] <= converged)
        else:
            for name in ("status", "iterations"):
                np.testing.assert_array_equal(compiled[name], array_code[name], err_msg=name)
        np.testing.assert_array_equal(compiled["dof"], array_code["dof"])
        assert {STATUS_NAMES[s] for s in compiled["status"]} >= {"singular", "invalid_input"}
        for name in get_model("gaussian").params:
            ours, theirs, err = compiled[name], array_code[name], array_code[f"{name}_err"]
            np.testing.assert_array_equal(np.isnan(ours), np.isnan(theirs))
            fitted = ~np.isnan(err)
            close = 1e-6 if options is TIGHT else 1e-9
            assert (np.abs(ours - theirs)[fitted] <= close * err[fitted]).all(), name
            np.testing.assert_allclose(compiled[f"{name}_err"], err, rtol=close)
        np.testing.assert_allclose(compiled["chi2"], array_code["chi2"], rtol=1e-10)


def _systems(seed: int = 0):
    """Normal matrices ``J^T J`` (4, 8, 8) and gradients: 0 and 3 well conditioned, 1
    exactly singular (two equal columns: LU meets a zero pivot), 2 near-singular (an
    eigenvalue ratio near 1e-16, which LU factors without complaint)."""
    rng = np.random.default_rng(seed)
    jac = rng.standard_normal((4, 30, 8))
    jac[1, :, 5] = jac[1, :, 2]
    jac[2, :, 7] = jac[2, :, 6] * (1 + 1e-8)
    return jac.transpose(0, 2, 1) @ jac, rng.standard_normal((4, 8))


def test_the_host_solve_flags_near_singular_systems_when_the_batch_cannot_be_factored():
    """numpy raises LinAlgError for the whole batch when one matrix has a zero pivot; the
    eigenvalues then flag every singular one, the near-singular included. Without such a
    matrix in the batch, the near-singular one is stepped (its fit ends singular later, by
    the errors' eigenvalues). This is the rule ``gpu.solve`` follows."""
    m, g = _systems()
    delta, singular = cpu.solve(m, g)
    assert singular.tolist() == [False, True, True, False]
    assert (delta[singular] == 0).all()
    np.testing.assert_allclose(delta[0], np.linalg.solve(m[0], g[0]), rtol=1e-10)
    _, without = cpu.solve(m[[0, 2, 3]], g[[0, 2, 3]])
    assert without.tolist() == [False, False, False]
    m[3, 4, 4] = np.nan
    assert cpu.solve(m, g)[1].tolist() == [False, True, True, True]


@pytest.mark.gpu
def test_gpu_solve_flags_what_the_cpu_solve_flags():
    """``gpu.solve`` against ``cpu.solve``: cupy's LU raises nothing, so the twin looks for
    the failed factorisation itself; the same systems are singular with or without a matrix
    LU cannot factor in the batch."""
    import cupy

    from outcore.fit.kernels import gpu

    m, g = _systems()
    for rows in ([0, 1, 2, 3], [0, 2, 3]):
        host_delta, host_flags = cpu.solve(m[rows], g[rows])
        delta, flags = gpu.solve(cupy.asarray(m[rows]), cupy.asarray(g[rows]))
        np.testing.assert_array_equal(cupy.asnumpy(flags), host_flags)
        well = np.isin(rows, [0, 3])  # the near-singular step is rounding, not a number
        np.testing.assert_allclose(cupy.asnumpy(delta)[well], host_delta[well], rtol=1e-8)


@pytest.mark.gpu
@pytest.mark.parametrize("model", ["gaussian", "psf"])
def test_gpu_fit_chunk_equals_the_cpu_twin(model, monkeypatch):
    """``fit_chunk`` on cupy arrays (``gpu.fit_chunk``) against the host twin: the same
    statuses as the host's array code (a blank stamp singular, a NaN invalid), the same
    converged set as the compiled loop at tight tolerances, and the same fits to rounding."""
    import cupy

    from outcore.fit.kernels import gpu

    arrays_in, _ = _catalog(300, model, mask_fraction=0.02)
    arrays_in["images"][5, 3, 3] = np.nan
    arrays_in["images"][7] = 0.0
    on_device = {k: cupy.asarray(v) for k, v in arrays_in.items()}
    host = fit_chunk(**arrays_in, model=model, **TIGHT)
    device = fit_chunk(**on_device, model=model, **TIGHT)
    assert isinstance(device, cupy.ndarray)
    device = cupy.asnumpy(device)
    names = get_model(model).params
    np.testing.assert_array_equal(device[:, -1] <= STATUS["converged_g_tol"],
                                  host[:, -1] <= STATUS["converged_g_tol"])
    assert device[5, -1] == STATUS["invalid_input"] and device[7, -1] == STATUS["singular"]
    fitted = host[:, -1] <= STATUS["converged_g_tol"]
    np.testing.assert_allclose(device[fitted, : 2 * len(names) + 1],
                               host[fitted, : 2 * len(names) + 1], rtol=1e-6, atol=1e-9)
    monkeypatch.setattr(cpu, "COMPILED_MODELS", ())
    options = {"model": model, "max_iterations": 100, "f_tol": 1e-8, "x_tol": 1e-8,
               "g_tol": 1e-8, "scale_errors": False}
    array_code = cpu.fit_chunk(arrays_in["images"], arrays_in["variance"], arrays_in["mask"],
                               psf=arrays_in.get("psf"), **options)
    twin = cupy.asnumpy(gpu.fit_chunk(on_device["images"], on_device["variance"],
                                      on_device["mask"], psf=on_device.get("psf"), **options))
    np.testing.assert_array_equal(twin[:, -1], array_code[:, -1])
