"""outcore.fit from Python on a cluster the user started: lazy fits with their coordinates and
units, a transposed catalog reordered (not misread), the command line's fits equal to the
Python call's, and the family's part of the bad-input battery (one OutcoreError each,
before any task, in keywords and never a --flag)."""

from __future__ import annotations

import re
import warnings

import dask.array as da
import distributed
import numpy as np
import pytest
import xarray as xr

import outcore
from outcore.cli import main
from outcore.errors import ArgumentError, LayoutError, OutcoreError, PlanError
from outcore.fit import (
    fit_dipoles,
    moffat_psf,
    plan_fit_dipoles,
    save_fits,
    simulate_catalog,
    status_counts,
)
from outcore.runs import load_summary

FLAG = re.compile(r"(?<![\w-])--[a-z]")


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
def simulated():
    catalog, truth = simulate_catalog(200, seed=21, mask_fraction=0.01, chunk_size=64)
    catalog["images"].attrs["units"] = "adu"
    return catalog, truth


def test_fits_are_lazy_with_candidate_ids_and_units_in_pixels(client, simulated):
    catalog, truth = simulated
    unread = fit_dipoles(catalog.assign(images=catalog["images"].copy(
        data=catalog["images"].data.map_blocks(_boom, dtype=np.float64))))
    assert all(isinstance(v.data, da.Array) for v in unread.data_vars.values())  # not read
    fits = fit_dipoles(catalog)
    assert fits["x_pos"].attrs["units"] == fits["sigma"].attrs["units"] == "pixel"
    assert fits["flux_pos"].attrs["units"] == "adu x pixel^2"
    assert fits["background"].attrs["units"] == "adu"
    np.testing.assert_array_equal(fits["candidate_id"].values, np.arange(200))
    plan = plan_fit_dipoles(catalog)
    assert plan.fits and plan.workers == 2 and plan.memory_limit == 4 * 2**30
    assert plan.config["chunk_size"] == 16  # 200 stamps: 8 or more tasks, a power of two
    done = fits.persist()
    counts = status_counts(done)
    assert sum(counts.values()) == 200 and counts["invalid_input"] == 0
    ok = done["status"].str.startswith("converged").values
    pulls = ((done["x_pos"] - truth["x_pos"]) / done["x_pos_err"]).values[ok]
    assert ok.sum() >= 195 and 0.7 < np.std(pulls) < 1.3  # the errors describe the scatter


def test_a_transposed_catalog_an_images_array_and_a_store_give_the_same_fits(
        client, simulated, tmp_path):
    catalog, _ = simulated
    reference = fit_dipoles(catalog).compute()
    transposed = catalog.transpose("candidate", "x", "y")
    assert transposed["images"].dims == ("candidate", "x", "y")
    xr.testing.assert_identical(fit_dipoles(transposed).compute(), reference)
    # misread, x and y would swap: the fits of the transposed stamps are another answer
    swapped = catalog.assign({name: (("candidate", "y", "x"), transposed[name].data)
                              for name in ("images", "variance", "mask")})
    mirrored = fit_dipoles(swapped).compute()
    np.testing.assert_allclose(mirrored["x_pos"], reference["y_pos"], atol=1e-6)
    assert np.abs(mirrored["x_pos"] - reference["x_pos"]).max() > 0.5
    images_only = fit_dipoles(catalog["images"].transpose("x", "candidate", "y")).compute()
    xr.testing.assert_identical(
        images_only, fit_dipoles(catalog.drop_vars(["variance", "mask"])).compute())
    outcore.save(catalog, tmp_path / "catalog.zarr")
    xr.testing.assert_identical(fit_dipoles(tmp_path / "catalog.zarr").compute(), reference)


def test_the_command_line_writes_the_python_fits(client, simulated, tmp_path):
    catalog, _ = simulated
    store = outcore.save(catalog, tmp_path / "catalog.zarr")
    python = save_fits(fit_dipoles(store), tmp_path / "fits.zarr")
    # the CLI's in-process workers are dask's threaded scheduler: it starts no cluster, and
    # the caller's default client stays theirs
    assert main(["fit-dipoles", "--input", str(store), "--cluster", "threads",
                 "--workers", "2", "--no-progress", "--output-dir", str(tmp_path),
                 "--name", "run"]) == 0
    assert distributed.default_client() is client
    assert load_summary(tmp_path / "run")["cluster"]["scheduler"] == "dask.threaded"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # consolidated metadata: no warning on a plain open
        cli = xr.open_zarr(tmp_path / "run" / "fits.zarr").compute()
        mine = xr.open_zarr(python).compute()
    assert list(cli.data_vars) == list(mine.data_vars) and cli.sizes == mine.sizes
    for name in cli.variables:
        np.testing.assert_array_equal(cli[name].values, mine[name].values, err_msg=name)
    assert cli["x_pos"].attrs == mine["x_pos"].attrs and cli.attrs == mine.attrs


# --- the bad-input battery: one OutcoreError each, before any task, in keywords ------------


def _boom(block: np.ndarray) -> np.ndarray:
    raise AssertionError("the catalog was read")


@pytest.fixture(scope="module")
def untouchable():
    """A catalog whose images raise if any task reads them."""
    catalog, _ = simulate_catalog(40, seed=2)
    return catalog.assign(images=(catalog["images"].dims,
                                  catalog["images"].data.map_blocks(_boom, dtype=np.float64)))


BATTERY = {
    "fit-wrong-type": (lambda c: fit_dipoles(np.zeros((40, 17, 17))), ArgumentError,
                       r"catalog= is a ndarray.*xr\.DataArray\(images, dims=\('candidate',"),
    "fit-wrong-dims": (lambda c: fit_dipoles(c["images"].rename(x="col")), LayoutError,
                       r"images.*dims.*'col'"),
    "fit-mismatched-variance": (
        lambda c: fit_dipoles(c.assign(variance=c["variance"].rename(x="u"))), LayoutError,
        "variance"),
    "fit-psf-wrong-shape": (lambda c: fit_dipoles(c, model="psf", psf=np.ones((7, 15, 15))),
                            LayoutError, r"psf= has shape \(7, 15, 15\); expected \(py, px\)"
                                         r" for every candidate or \(40, py, px\)"),
    "fit-psf-unused": (lambda c: fit_dipoles(c, psf=moffat_psf()), LayoutError,
                       r"model='gaussian' does not use one. Fix: drop psf=, or use"
                       r" model='psf'"),
    "fit-unknown-keyword": (lambda c: fit_dipoles(c, chunksize=64), ArgumentError,
                            r"takes no keyword chunksize=\. Fix: did you mean chunk_size=\?"),
    "fit-unknown-model": (lambda c: fit_dipoles(c, model="moffat"), OutcoreError,
                          "model='moffat' is not one of gaussian, psf"),
    "fit-chunk-size-zero": (lambda c: fit_dipoles(c, chunk_size=0), LayoutError,
                            "chunk_size=0 must be at least 1"),
    "fit-status-counts-wrong-type": (lambda c: status_counts(c), ArgumentError,
                                     "not the fits of fit_dipoles"),
    "fit-simulate-no-candidates": (lambda c: simulate_catalog(0), OutcoreError,
                                   "n=0 must be at least 1"),
}


@pytest.mark.parametrize("case", sorted(BATTERY))
def test_bad_input_is_one_error_in_keywords_before_any_task(client, untouchable, case):
    call, error, says = BATTERY[case]
    with pytest.raises(error, match=says) as info:
        call(untouchable)
    assert isinstance(info.value, OutcoreError)
    assert not FLAG.search(str(info.value)), str(info.value)


def test_fit_memory_limit_too_small_is_refused_before_any_task(untouchable):
    """fit-memory-too-small: a user's cluster of 250 MiB workers cannot hold a worker that
    fits (numba's loop alone is 390 MiB): one PlanError naming keywords, nothing run."""
    lc, small = _user_cluster("250MiB")
    try:
        with pytest.raises(PlanError, match=r"over its budget of 150\.00 MiB.*Fix: use a"
                                            r" smaller chunk_size=.*raise memory_limit= to"
                                            ) as info:
            fit_dipoles(untouchable)
        assert not FLAG.search(str(info.value))
        assert _transitions(small) == 0
    finally:
        small.close()
        lc.close()
