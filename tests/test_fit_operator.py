"""fit_dipoles: one answer whatever the chunking or the cluster, checks before compute, layout."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest
import xarray as xr
from distributed import Client, LocalCluster

from outcore import backend
from outcore.errors import BackendError, LayoutError, OutcoreError
from outcore.fit import STATUS_NAMES, fit_dipoles, moffat_psf, simulate_catalog, status_counts


@pytest.fixture(scope="module")
def catalog() -> xr.Dataset:
    """1000 simulated dipoles, with masks and a few candidates broken on purpose, in memory."""
    lazy, _ = simulate_catalog(1000, seed=3, mask_fraction=0.02, noise="poisson")
    ds = lazy.compute()
    ds.images.values[10, 4, 4] = np.nan
    ds.variance.values[500, 0, 0] = -1.0
    ds.mask.values[999] = True
    return ds


@pytest.fixture(scope="module")
def reference(catalog) -> xr.Dataset:
    return fit_dipoles(catalog, chunk_size=64).compute(scheduler="synchronous")


def test_result_layout(catalog, reference):
    result = fit_dipoles(catalog, chunk_size=256)
    assert all(isinstance(v.data, da.Array) for v in result.data_vars.values())
    assert result.x_pos.chunks == ((256, 256, 256, 232),)
    params = ["x_pos", "y_pos", "x_neg", "y_neg", "flux_pos", "flux_neg", "sigma", "background"]
    expected = params + [f"{p}_err" for p in params] + ["chi2", "dof", "iterations", "status"]
    assert list(result.data_vars) == expected
    assert result.attrs["parameters"] == params
    assert result.x_pos.attrs["units"] == "pixel"
    np.testing.assert_array_equal(reference.candidate_id.values, np.arange(1000))
    assert reference.dof.dtype == np.int64 and reference.status.dtype.kind == "U"
    assert set(np.unique(reference.status.values)) <= set(STATUS_NAMES)
    assert reference.status.values[[10, 500, 999]].tolist() == ["invalid_input"] * 3
    counts = status_counts(result)
    assert list(counts) == list(STATUS_NAMES) and sum(counts.values()) == 1000
    assert counts["invalid_input"] == 3
    assert counts == status_counts(reference)


@pytest.mark.parametrize("chunk_size", [7, 1000])
def test_same_result_for_any_chunk_size(catalog, reference, chunk_size):
    lazy = catalog.chunk({"candidate": 100})  # stored chunks differ from the fit's chunks
    result = fit_dipoles(lazy, chunk_size=chunk_size).compute(scheduler="synchronous")
    xr.testing.assert_identical(result, reference)


def test_same_result_on_a_distributed_cluster(catalog, reference):
    with (
        LocalCluster(processes=False, n_workers=2, threads_per_worker=1,
                     dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        result = client.compute(fit_dipoles(catalog, chunk_size=64)).result()
    xr.testing.assert_identical(result, reference)


def _boom(block: np.ndarray) -> np.ndarray:
    raise AssertionError("the catalog was computed")


def _untouchable(catalog: xr.Dataset) -> xr.Dataset:
    """The catalog with images that raise if any task reads them."""
    images = catalog.images.chunk({"candidate": 100}).data.map_blocks(_boom, dtype=np.float64)
    return catalog.assign(images=(catalog.images.dims, images))


def test_nothing_is_computed_until_asked(catalog):
    result = fit_dipoles(_untouchable(catalog), chunk_size=128)
    with pytest.raises(AssertionError, match="computed"):
        result.x_pos.compute(scheduler="synchronous")


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda ds: ds.drop_vars("images"), "images"),
        (lambda ds: ds.rename_dims({"x": "u"}).drop_vars("variance"), "dims"),
        (lambda ds: ds.assign(variance=ds.variance.rename({"x": "u", "y": "v"})), "dims"),
        (lambda ds: ds.assign(mask=ds.mask.astype("float32")), "dtype"),
        (lambda ds: ds.drop_vars("candidate_id"), "candidate_id"),
        (lambda ds: ds.isel(candidate=slice(0, 0)), "no candidates"),
    ],
)
def test_whole_catalog_errors_before_compute(catalog, change, match):
    with pytest.raises(LayoutError, match=match):
        fit_dipoles(change(_untouchable(catalog)))


def test_psf_errors_before_compute(catalog):
    ds = _untouchable(catalog)
    with pytest.raises(LayoutError, match="needs a PSF"):
        fit_dipoles(ds, model="psf")
    with pytest.raises(LayoutError, match="does not use one"):
        fit_dipoles(ds, psf=moffat_psf())
    with pytest.raises(LayoutError, match="shape"):
        fit_dipoles(ds, model="psf", psf=np.ones((999, 15, 15)))
    with pytest.raises(LayoutError, match="shape"):
        fit_dipoles(ds, model="psf", psf=np.ones(15))
    with pytest.raises(LayoutError, match="positive"):
        fit_dipoles(ds, model="psf", psf=np.zeros((15, 15)))
    with pytest.raises(LayoutError, match="dims"):
        fit_dipoles(ds.assign(psf=(("a", "b"), moffat_psf())), model="psf")
    with pytest.raises(ValueError, match="chunk_size=0 must be at least 1"):
        fit_dipoles(ds, chunk_size=0)
    with pytest.raises(OutcoreError, match="model='moffat' is not one of gaussian, psf"):
        fit_dipoles(ds, model="moffat")


def test_psf_model_per_catalog_and_per_candidate():
    lazy, _ = simulate_catalog(40, 15, seed=9, model="psf")
    shared = fit_dipoles(lazy, model="psf", chunk_size=16).compute()
    assert status_counts(shared)["converged_f_tol"] + status_counts(shared)["converged_x_tol"] \
        + status_counts(shared)["converged_g_tol"] == 40
    explicit = fit_dipoles(lazy.drop_vars("psf"), model="psf", psf=lazy.psf.values).compute()
    xr.testing.assert_identical(explicit, shared)
    stack = np.repeat(lazy.psf.values[None], 40, axis=0)
    stack[5] = np.nan
    per_candidate = lazy.assign(psf=(("candidate", "psf_y", "psf_x"), stack))
    each = fit_dipoles(per_candidate, model="psf", chunk_size=16).compute()
    assert each.status.values[5] == "invalid_input"
    keep = np.arange(40) != 5
    xr.testing.assert_identical(each.isel(candidate=keep), shared.isel(candidate=keep))


@pytest.mark.skipif(backend.gpu_available(), reason="checks the message shown without a GPU")
def test_cupy_backend_without_a_gpu_is_refused(catalog):
    with pytest.raises(BackendError, match="cupy"):
        fit_dipoles(catalog, backend="cupy")


@pytest.mark.gpu
def test_cupy_backend_matches_numpy(catalog, reference):
    with dask.config.set(scheduler="synchronous"):
        result = fit_dipoles(catalog, chunk_size=256, backend="cupy",
                             f_tol=1e-12, x_tol=1e-12, g_tol=1e-12).compute()
        host = fit_dipoles(catalog, chunk_size=256,
                           f_tol=1e-12, x_tol=1e-12, g_tol=1e-12).compute()
    assert isinstance(result.x_pos.values, np.ndarray)
    np.testing.assert_array_equal(result.status.values == "invalid_input",
                                  host.status.values == "invalid_input")
    for name in ("x_pos", "y_pos", "x_neg", "y_neg", "flux_pos", "flux_neg", "sigma",
                 "x_pos_err", "chi2"):
        np.testing.assert_allclose(result[name].values, host[name].values, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("stamp", [(9, 9), (17, 17), (33, 25)])
def test_the_compiled_loop_runs_from_a_catalog_of_2_20_stamp_pixels(stamp):
    """A Gaussian fit on the host loads numba's compiled loop for a catalog of at least
    COMPILED_FROM_PIXELS stamp pixels (the integer boundary, per stamp size), and fits a
    smaller one with the array code; the plan records which, and counts numba's worker
    baseline only with the loop. The PSF model has no loop."""
    from outcore.fit import plan_fit_dipoles
    from outcore.fit.kernels.cpu import COMPILED_FROM_PIXELS, use_compiled
    from outcore.fit.memory import FIT_WORKER_BASELINE_BYTES
    from outcore.plan import Resources

    pixels = stamp[0] * stamp[1]
    first = -(-COMPILED_FROM_PIXELS // pixels)  # the fewest stamps that reach it
    assert not use_compiled("gaussian", first - 1, stamp)
    assert use_compiled("gaussian", first, stamp) and not use_compiled("psf", first, stamp)
    resources = Resources(2, 1, 2**30)
    for n, compiled in ((8, False), (first, True)):
        catalog = xr.Dataset({"images": (("candidate", "y", "x"),
                                         da.zeros((n, *stamp), chunks=(512, *stamp)))},
                             coords={"candidate_id": ("candidate", np.arange(n))})
        plan = plan_fit_dipoles(catalog, resources=resources)
        assert plan.config["compiled_loop"] is compiled
        assert (plan.baseline_bytes == FIT_WORKER_BASELINE_BYTES) is compiled
