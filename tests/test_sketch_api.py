"""outcore.sketch from Python on a cluster the user started: svd computes (the factors against
numpy's SVD) with coordinates and units, a transposed stack reordered (not misread),
reconstruct lazy, progress in a notebook without ipywidgets, the command line's components
equal to the Python call's, and the family's part of the bad-input battery (one
OutcoreError each, before any read, in keywords and never a --flag)."""

from __future__ import annotations

import re
import sys
import warnings

import dask.array as da
import distributed
import numpy as np
import pytest
import xarray as xr

import outcore
from outcore import progress
from outcore.cli import main
from outcore.errors import ArgumentError, LayoutError, OutcoreError, PlanError
from outcore.sketch import plan_svd, reconstruct, simulate_phases, svd

FLAG = re.compile(r"(?<![\w-])--[a-z]")
DIMS = ("scan_y", "scan_x", "k_y", "k_x")


def _user_cluster(memory_limit: str) -> tuple[distributed.LocalCluster, distributed.Client]:
    """The cluster a notebook user starts, its client the default one."""
    lc = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                  memory_limit=memory_limit, dashboard_address=":0")
    return lc, distributed.Client(lc)


def _transitions(client: distributed.Client) -> int:
    """Task transitions the scheduler has made since it started (none: nothing ran)."""
    return client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.transition_counter)


@pytest.fixture(scope="module")
def client():
    # 4 GiB: in-process workers measure the whole test process's memory
    lc, client = _user_cluster("4GiB")
    yield client
    client.close()
    lc.close()


@pytest.fixture(scope="module")
def exact() -> xr.Dataset:
    """A stack of rank 4: 12 x 10 positions of 8 x 9 pixels in counts, float64, with a
    detector coordinate in 1/m along k_x, in blocks of 3 scan rows."""
    rng = np.random.default_rng(5)
    u = np.linalg.qr(rng.standard_normal((120, 4)))[0]
    v = np.linalg.qr(rng.standard_normal((72, 4)))[0]
    a = (u * np.array([40.0, 9, 3, 1])) @ v.T
    data = da.from_array(a.reshape(12, 10, 8, 9), chunks=(3, 10, 8, 9))
    k_x = xr.Variable("k_x", np.linspace(-4e8, 4e8, 9), {"units": "1/m"})
    return xr.Dataset({"data": (DIMS, data, {"units": "counts"})}, coords={"k_x": k_x},
                      attrs={"wavelength": 2e-12, "scan_step": 1e-9,
                             "reciprocal_pixel_size": 1e8})


def _matrix(values: np.ndarray) -> np.ndarray:
    return np.asarray(values, np.float64).reshape(120, 72)


def test_svd_computes_numpy_s_factors_with_coordinates_and_units(client, exact):
    result = svd(exact, 4, power_iterations=1)
    assert all(isinstance(v.data, np.ndarray) for v in result.data_vars.values())  # computed
    uu, ss, vt = np.linalg.svd(_matrix(exact["data"].values), full_matrices=False)
    np.testing.assert_allclose(result["singular_values"].values, ss[:4], rtol=1e-9)
    v = result["v"].values.reshape(4, -1)
    np.testing.assert_allclose(np.abs(v @ vt[:4].T), np.eye(4), atol=1e-9)
    assert result["u"].dims == ("scan_y", "scan_x", "component")
    assert result["v"].dims == ("component", "k_y", "k_x")
    assert result["singular_values"].attrs["units"] == "counts"
    np.testing.assert_array_equal(result["k_x"].values, exact["k_x"].values)  # the input's
    assert result["k_x"].attrs["units"] == "1/m"
    for dim, size in (("scan_y", 12), ("scan_x", 10), ("k_y", 8)):  # none given: pixels
        np.testing.assert_array_equal(result[dim].values, np.arange(size))
        assert result[dim].attrs["units"] == "pixel"
    np.testing.assert_array_equal(result["component"].values, np.arange(4))
    plan = plan_svd(exact, 4, power_iterations=1)
    assert plan.fits and tuple(plan.choices) == tuple(result.attrs["block_items"])


def test_a_transposed_stack_an_array_in_memory_and_a_store_give_the_same_factors(
        client, exact, tmp_path):
    reference = svd(exact, 4, power_iterations=1)
    blocks = svd(exact.compute(), 4, power_iterations=1, chunks={"scan_y": 6})
    assert blocks.attrs["block_items"] == [6, 10]  # in memory, a dim left out stays whole
    turned = exact["data"].transpose("k_x", "scan_y", "k_y", "scan_x")
    for given in (turned, exact.compute(), outcore.save(exact, tmp_path / "s.zarr")):
        other = svd(given, 4, power_iterations=1)
        assert other["u"].dims == reference["u"].dims and other["v"].dims == reference["v"].dims
        for name in ("singular_values", "u", "v"):
            np.testing.assert_allclose(other[name].values, reference[name].values,
                                       rtol=1e-9, atol=1e-12, err_msg=name)


def test_reconstruct_is_lazy_and_gives_the_rank_k_stack(client, exact):
    components = svd(exact, 4, power_iterations=1, center=True)
    denoised = reconstruct(components, exact, rank=2)
    assert isinstance(denoised["data"].data, da.Array)  # lazy: computed below
    assert denoised["data"].dims == DIMS
    u = components["u"].values.reshape(120, 4)[:, :2]
    v = components["v"].values.reshape(4, 72)[:2]
    s = components["singular_values"].values[:2]
    twin = (u * s) @ v + components["mean"].values.ravel()
    np.testing.assert_allclose(_matrix(denoised["data"].values), twin, rtol=1e-9, atol=1e-9)


def test_progress_in_a_notebook_needs_no_ipywidgets(client, exact, monkeypatch, capsys):
    """In Jupyter without ipywidgets (distributed.utils.is_kernel true, the import failing)
    the sketch shows dask's text bar and finishes."""
    import distributed.utils

    monkeypatch.setattr(distributed.utils, "is_kernel", lambda: True)
    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # import ipywidgets fails
    token = progress.SHOW_PROGRESS.set(True)
    try:
        result = svd(exact, 2, power_iterations=0, hold=False)
    finally:
        progress.SHOW_PROGRESS.reset(token)
    assert result.attrs["passes"] == 2
    out = capsys.readouterr().out
    assert out.count("100% Completed") == 2, out  # a bar for each read of the stack


def test_the_command_line_writes_the_python_components(client, tmp_path):
    stack, _ = simulate_phases((12, 16), 32, 3, dose=1e4, seed=2, chunk_rows=2)
    store = outcore.save(stack, tmp_path / "phases.zarr", layout="diffraction")
    python = svd(store, 5, center=True, power_iterations=1)
    with pytest.warns(UserWarning, match="in place of the one you had"):  # the CLI's own
        assert main(["sketch", "svd", "--input", str(store), "--rank", "5", "--center",
                     "--power-iterations", "1", "--cluster", "threads", "--workers", "2",
                     "--no-progress", "--output-dir", str(tmp_path), "--name", "run"]) == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # consolidated metadata: no warning on a plain open
        cli = xr.open_zarr(tmp_path / "run" / "components.zarr").compute()
    assert cli.attrs["block_items"] == python.attrs["block_items"]
    assert set(cli.data_vars) == set(python.data_vars)
    for name in cli.variables:
        np.testing.assert_allclose(cli[name].values, python[name].values, rtol=1e-12,
                                   atol=1e-15, err_msg=name)


# --- the bad-input battery: one OutcoreError each, before any read, in keywords ------------


def _poisoned(block: np.ndarray) -> np.ndarray:
    raise AssertionError("the stack was read")


@pytest.fixture(scope="module")
def untouchable(exact) -> xr.Dataset:
    """``exact`` with a stack that raises if any task reads it."""
    data = exact["data"]
    return exact.assign(data=data.copy(data=data.data.map_blocks(_poisoned, dtype=np.float64)))


@pytest.fixture(scope="module")
def components(client, exact) -> xr.Dataset:
    return svd(exact, 3, power_iterations=0)


BATTERY = {
    "sketch-wrong-type": (lambda ds, c: svd(np.zeros((4, 4, 8, 8)), 2), ArgumentError,
                          r"data= is a ndarray without dimension names.*Fix: wrap it:"
                          r" data=xr\.DataArray\(array, dims="),
    "sketch-unknown-keyword": (lambda ds, c: svd(ds, 2, power_iteration=1), ArgumentError,
                               r"takes no keyword power_iteration=\. Fix: did you mean"
                               r" power_iterations=\?"),
    "sketch-rank-above-the-stack": (lambda ds, c: svd(ds, 73), OutcoreError,
                                    r"rank=73 is above the stack's smaller side: 120 items by"
                                    r" 72 pixels.*Fix: give rank=72 or less"),
    "sketch-negative-oversample": (lambda ds, c: svd(ds, 2, oversample=-1), OutcoreError,
                                   "oversample=-1 must be at least 0"),
    "sketch-missing-variable": (lambda ds, c: svd(ds, 2, var="intensity"), LayoutError,
                                r"no variable 'intensity'.*Fix: give var= the name"),
    "sketch-complex-stack": (lambda ds, c: svd(ds.astype(np.complex64), 2), LayoutError,
                             r"'data' is complex \(complex64\)"),
    "sketch-chunks-of-a-pixel-dim": (lambda ds, c: svd(ds, 2, chunks={"k_y": 4}), LayoutError,
                                     r"chunks= names \['k_y'\], not among the item dims"),
    "sketch-reconstruct-rank-above": (lambda ds, c: reconstruct(c, ds, rank=9), OutcoreError,
                                      r"rank=9 is not a number of components from 1 to 3"),
    "sketch-reconstruct-other-stack": (
        lambda ds, c: reconstruct(c, ds.isel(scan_x=slice(0, 5))), LayoutError,
        r"components= are of a stack of \(12, 10\) items"),
}


@pytest.mark.parametrize("case", sorted(BATTERY))
def test_bad_input_is_one_error_in_keywords_before_any_read(client, untouchable, components,
                                                            case):
    call, error, says = BATTERY[case]
    with pytest.raises(error, match=says) as info:
        call(untouchable, components)
    assert isinstance(info.value, OutcoreError)
    assert not FLAG.search(str(info.value)), str(info.value)


def test_sketch_memory_limit_too_small_is_refused_before_any_task(untouchable):
    """sketch-memory-too-small: a user's cluster of 250 MiB workers: one PlanError naming
    keywords (memory_limit=, rank=), nothing run."""
    lc, small = _user_cluster("250MiB")
    try:
        with pytest.raises(PlanError, match=r"over its budget of 150\.00 MiB.*Fix: save the"
                                            r" stack in smaller chunks.*smaller rank= or"
                                            r" oversample=.*raise memory_limit= to") as info:
            svd(untouchable, 2)
        assert not FLAG.search(str(info.value))
        assert _transitions(small) == 0
    finally:
        small.close()
        lc.close()
