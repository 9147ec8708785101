"""outcore.sketch against truths it did not make: numpy's SVD, the Eckart-Young optimum and
the power-scheme bound of Halko, Martinsson and Tropp; the same factors on 1 and 2 workers and
on two chunkings; a stack twice the workers' memory; bad input refused in one line before
any compute; the verb's run directory."""

from __future__ import annotations

import math
import re

import dask
import dask.array as da
import numpy as np
import pytest
import xarray as xr
from scipy.linalg import subspace_angles

import outcore
from outcore import cluster
from outcore.cli import main
from outcore.errors import LayoutError, OutcoreError, PlanError
from outcore.io.store import write_new
from outcore.plan import Resources
from outcore.runs import load_summary
from outcore.sketch import draws, reconstruct, simulate_phases, svd
from outcore.sketch.memory import TASK_BYTES, plan_sketch
from outcore.sketch.stack import describe, item_chunkings

THREADS = ["--cluster", "threads", "--workers", "2", "--no-progress"]
MiB = 2**20
ATTRS = {"wavelength": 2e-12, "scan_step": 1e-9, "reciprocal_pixel_size": 1e8}


def _grid(a: np.ndarray, scan: tuple[int, int], frame: tuple[int, int],
          chunk_rows: int = 4) -> xr.Dataset:
    """The matrix ``a`` (items by pixels) as a diffraction stack on a ``scan`` grid."""
    data = da.from_array(a.reshape(*scan, *frame), chunks=(chunk_rows, scan[1], *frame))
    return xr.Dataset({"data": (("scan_y", "scan_x", "k_y", "k_x"), data)}, attrs=ATTRS)


def _matrix(ds: xr.Dataset, var: str = "data") -> np.ndarray:
    values = np.asarray(ds[var].values, np.float64)
    return values.reshape(math.prod(values.shape[:-2]), -1)


def _factors(result: xr.Dataset) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``u`` (items, k), ``s`` (k,), ``v`` (pixels, k) of a result."""
    k = result.sizes["component"]
    return (result["u"].values.reshape(-1, k), result["singular_values"].values,
            result["v"].values.reshape(k, -1).T)


def _low_rank(rng: np.random.Generator, n: int, m: int, spectrum: np.ndarray) -> np.ndarray:
    u = np.linalg.qr(rng.standard_normal((n, spectrum.size)))[0]
    v = np.linalg.qr(rng.standard_normal((m, spectrum.size)))[0]
    return (u * spectrum) @ v.T


@pytest.fixture(scope="module")
def exact() -> xr.Dataset:
    """A stack of exactly rank 7 (6 once centred: the seventh is a constant offset): 20 x 25
    positions of 12 x 15 pixels, float64."""
    rng = np.random.default_rng(11)
    return _grid(_low_rank(rng, 500, 180, np.array([50.0, 20, 9, 4, 2, 1])) + 3.0, (20, 25),
                 (12, 15))


@pytest.fixture(scope="module")
def noisy() -> xr.Dataset:
    """A decaying signal (sigma_j = 100 * 0.75^j, 30 terms) plus white noise: 40 x 30
    positions of 24 x 24 pixels, float32, a spectrum with a long flat tail."""
    rng = np.random.default_rng(12)
    a = _low_rank(rng, 1200, 576, 100 * 0.75 ** np.arange(30))
    a += 0.05 * rng.standard_normal(a.shape)
    return _grid(a.astype(np.float32), (40, 30), (24, 24))


# --- accuracy ---------------------------------------------------------------------------------


@pytest.mark.parametrize("center", [False, True])
def test_an_exact_rank_stack_gives_numpy_s_svd(exact, center):
    a = _matrix(exact)
    if center:
        a = a - a.mean(axis=0)
    k = 6 if center else 7
    result = svd(exact, k, oversample=5, power_iterations=1, center=center)
    u, s, v = _factors(result)
    uu, ss, vt = np.linalg.svd(a, full_matrices=False)
    assert np.max(np.abs(s / ss[:k] - 1)) < 1e-6
    assert np.max(subspace_angles(u, uu[:, :k])) < 1e-6
    assert np.max(subspace_angles(v, vt[:k].T)) < 1e-6
    assert np.max(np.abs(u.T @ u - np.eye(k))) < 1e-6
    assert np.max(np.abs(v.T @ v - np.eye(k))) < 1e-6
    for j in range(k):  # numpy's factors up to a sign, which makes v's largest entry positive
        assert v[np.argmax(np.abs(v[:, j])), j] > 0
        sign = np.sign(vt[j] @ v[:, j])
        np.testing.assert_allclose(sign * v[:, j], vt[j], atol=1e-6)
        np.testing.assert_allclose(sign * u[:, j], uu[:, j], atol=1e-6)
    if center:
        np.testing.assert_allclose(result["mean"].values.ravel(), _matrix(exact).mean(axis=0))
    assert result.attrs["passes"] == 3
    total = float(np.sum(a**2))
    assert result.attrs["total_sum_of_squares"] == pytest.approx(total, rel=1e-12)


def hmt_bound(sigma: np.ndarray, k: int, p: int, q: int) -> float:
    """Halko, Martinsson and Tropp (2011), Corollary 10.10: the expected spectral error of
    the power scheme with ``q`` iterations, ``[(1 + sqrt(k / (p - 1))) sigma_{k+1}^(2q+1) +
    e sqrt(k + p) / p (sum_{j>k} sigma_j^(2(2q+1)))^(1/2)]^(1/(2q+1))``."""
    power = 2 * q + 1
    tail = sigma[k:] ** power
    value = ((1 + math.sqrt(k / (p - 1))) * tail[0]
             + math.e * math.sqrt(k + p) / p * math.sqrt(np.sum(tail**2)))
    return value ** (1 / power)


@pytest.mark.parametrize("q", [0, 1, 2])
def test_a_noisy_stack_meets_the_power_scheme_bound(noisy, q):
    k, p = 10, 6
    a = _matrix(noisy)
    sigma = np.linalg.svd(a, compute_uv=False)
    result = svd(noisy, k, oversample=p, power_iterations=q, seed=3)
    u, s, v = _factors(result)
    bound = hmt_bound(sigma, k, p, q)
    # s_j are the singular values of A V V^T (V orthonormal): s_j <= sigma_j, and by Weyl
    # sigma_j - s_j <= ||A - A V V^T|| <= ||A - Q Q^T A||, HMT's error (rows of Q Q^T A lie
    # in the span of V), which the corollary bounds
    assert np.all(sigma[:k] - s <= bound), (sigma[:k] - s, bound)
    assert np.all(s <= sigma[:k] * (1 + 1e-10))
    error = np.linalg.norm(a - (u * s) @ v.T)
    optimum = math.sqrt(np.sum(sigma[k:] ** 2))  # Eckart-Young
    total = np.sum(sigma**2)
    assert result.attrs["residual_fraction"] == pytest.approx(error**2 / total, rel=1e-6)
    np.testing.assert_allclose(result["explained_variance_ratio"].values, s**2 / total,
                               rtol=1e-6)
    if q == 2:
        assert np.max(np.abs(s / sigma[:k] - 1)) < 0.01
        assert error <= 1.05 * optimum, (error, optimum)


# --- the same factors anywhere ---------------------------------------------------------------


def _apart(a: xr.Dataset, b: xr.Dataset) -> float:
    """The largest difference of two results' factors and singular values, relative to each
    array's largest entry."""
    return max(float(np.max(np.abs(a[name].values - b[name].values))
                     / np.max(np.abs(a[name].values)))
               for name in ("singular_values", "u", "v"))


@pytest.fixture
def started():
    """``started(kind, workers)``: a cluster's client, stopped at the end of the test."""
    clients = []
    scheduler = dask.config.get("scheduler", None)

    def start(kind: str, workers: int):
        # in-process workers pause on the whole test process's memory, which the test files
        # run before this one in the same process have grown: at 1 GiB one paused for good
        limit = "8GiB" if kind == "threads" else "1GiB"
        clients.append(cluster.start(kind, workers=workers, memory_limit=limit,
                                     dashboard_address="127.0.0.1:0"))
        return clients[-1]

    yield start
    for client in reversed(clients):
        cluster.stop(client)
    dask.config.set(scheduler=scheduler)


def test_the_same_seed_gives_the_same_factors_on_1_and_2_workers_and_two_chunkings(
        noisy, started):
    options = dict(oversample=6, power_iterations=1, seed=5)
    one = svd(noisy, 10, client=started("threads", 1), chunks={"scan_y": 4}, hold=False,
              **options)
    two = svd(noisy, 10, client=started("local", 2), hold=False, **options)  # the plan's blocks
    other = svd(noisy, 10, client=started("threads", 2),
                chunks={"scan_y": 7, "scan_x": 11}, hold=False, **options)
    assert (one.attrs["tasks_per_read"], two.attrs["tasks_per_read"],
            other.attrs["tasks_per_read"]) == (10, 5, 18)
    held = svd(noisy, 10, client=started("local", 2), hold=True, **options)
    assert _apart(one, two) < 1e-6
    assert _apart(one, other) < 1e-6
    assert _apart(one, held) < 1e-6
    assert (one.attrs["store_reads"], held.attrs["store_reads"], held.attrs["passes"]) == (3, 1, 3)
    # another seed: another sketch (at q = 0 the trailing components move visibly)
    a, b = (svd(noisy, 10, oversample=6, power_iterations=0, seed=seed) for seed in (5, 6))
    assert _apart(a, b) > 1e-3


def test_the_test_matrix_is_the_same_whatever_its_tiles():
    whole = draws.omega(4, 10_000, 7)
    assert whole.shape == (10_000, 7)
    np.testing.assert_array_equal(draws.omega_rows(4, 10_000, 7, 3000, 9000), whole[3000:9000])
    np.testing.assert_array_equal(draws.omega(4, 5000, 7), whole[:5000])
    assert not np.array_equal(draws.omega(5, 100, 7), whole[:100])
    assert abs(whole.mean()) < 0.02 and abs(whole.std() - 1) < 0.02


# --- out of core ------------------------------------------------------------------------------

SQUARE = 8  # pixels on a side of the constant squares of a pattern


def _coarse(row: int, columns: int, cells: int) -> np.ndarray:
    """The ``(columns, cells)`` coarse values of scan row ``row``: rank 5 plus a little
    noise, float32."""
    basis = np.random.default_rng(7).standard_normal((5, cells))
    rng = np.random.default_rng([7, row])
    values = (rng.standard_normal((columns, 5)) * np.array([8.0, 4, 2, 1, 0.5])) @ basis
    return (values + 0.01 * rng.standard_normal((columns, cells))).astype(np.float32)


@pytest.mark.slow
def test_a_stack_twice_the_workers_memory_streams_under_each_limit(tmp_path):
    limit, workers = 400 * MiB, 1  # one worker process: twice its memory in 2 minutes less
    scan, side = (164, 320), 64  # 0.86 GB of 64 x 64 float32 patterns, over 2 x 400 MiB
    cells = (side // SQUARE) ** 2

    def block(block_info=None):
        (y0, y1) = block_info[None]["array-location"][0]
        c = np.stack([_coarse(r, scan[1], cells) for r in range(y0, y1)])
        c = c.reshape(y1 - y0, scan[1], side // SQUARE, side // SQUARE)
        return c.repeat(SQUARE, axis=2).repeat(SQUARE, axis=3)

    data = da.map_blocks(block, chunks=((1,) * scan[0], (scan[1],), (side,), (side,)),
                         dtype=np.float32)
    assert data.nbytes > 2 * workers * limit
    ds = xr.Dataset({"data": (("scan_y", "scan_x", "k_y", "k_x"), data)}, attrs=ATTRS)
    outcore.save(ds, tmp_path / "big.zarr")
    assert main(["sketch", "svd", "--input", str(tmp_path / "big.zarr"), "--rank", "3",
                 "--oversample", "6", "--power-iterations", "1", "--cluster", "local",
                 "--workers", str(workers), "--memory-limit", f"{limit}", "--no-progress",
                 "--output-dir", str(tmp_path), "--name", "big"]) == 0
    summary = load_summary(tmp_path / "big")
    peaks = summary["metrics"]["peak_worker_rss_bytes"]
    assert len(peaks) == workers and all(peak < limit for peak in peaks.values()), peaks
    assert summary["plan"]["fits"] and summary["metrics"]["store_reads"] == 3
    # each coarse value stands for SQUARE^2 pixels: the singular values are SQUARE times
    # those of the coarse matrix
    coarse = np.concatenate([_coarse(r, scan[1], cells) for r in range(scan[0])])
    truth = SQUARE * np.linalg.svd(coarse.astype(np.float64), compute_uv=False)[:3]
    np.testing.assert_allclose(summary["metrics"]["singular_values"], truth, rtol=1e-5)


# --- bad input --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def stores(tmp_path_factory, exact):
    """``exact`` as a diffraction store; a stack stored in 8 MiB chunks (more than a
    360 MiB worker can hold a task of); a complex stack in a store without a layout."""
    folder = tmp_path_factory.mktemp("sketch")
    outcore.save(exact, folder / "exact.zarr", layout="diffraction")
    data = da.ones((4096, 32, 32), dtype=np.float32, chunks=(2048, 32, 32))
    outcore.save(xr.Dataset({"data": (("position", "k_y", "k_x"), data),
                             "positions": (("position", "xy"), np.zeros((4096, 2)))},
                            coords={"xy": ["x", "y"]}, attrs=ATTRS),
                 folder / "coarse.zarr", layout="diffraction")
    write_new(xr.Dataset({"data": (("view", "v", "u"), np.ones((6, 4, 5), np.complex64))}),
              folder / "complex.zarr")
    return folder


@pytest.mark.parametrize(("store", "options", "says"), [
    ("exact", ["--rank", "0"], "--rank 0 must be at least 1"),
    ("exact", ["--rank", "181"], "--rank 181 is above the stack's smaller side: 500 items by"
                                 " 180 pixels"),
    ("exact", ["--rank", "3", "--var", "intensity"], "The dataset has no variable 'intensity'"),
    ("exact", ["--rank", "3", "--power-iterations", "-1"],
     "--power-iterations -1 must be at least 0"),
    ("exact", ["--rank", "3", "--oversample", "-2"], "--oversample -2 must be at least 0"),
    ("exact", ["--rank", "3", "--seed", "-1"], "--seed -1 must be at least 0"),
    ("complex", ["--rank", "2"], r"The variable 'data' is complex \(complex64\)"),
    # the store's blocks are the least a task reads: the fix is a re-chunked store (the
    # plan named "a smaller chunk size", an option the verb does not have)
    ("coarse", ["--rank", "3", "--memory-limit", "360MiB"],
     "The plan does not fit.* re-chunk the store into smaller blocks along its items"),
], ids=["rank-0", "rank-above", "missing-var", "negative-q", "negative-p", "negative-seed",
        "complex", "plan"])
def test_bad_options_are_refused_in_one_line_before_compute(stores, tmp_path, capsys, store,
                                                            options, says):
    code = main(["sketch", "svd", "--input", str(stores / f"{store}.zarr"), *options,
                 *THREADS, "--output-dir", str(tmp_path / "runs")])
    err = capsys.readouterr().err.strip()
    assert code == 1
    assert len(err.splitlines()) == 1 and re.search(says, err) and "Fix:" in err, err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_bad_stacks_are_refused_by_the_api_before_compute(exact):
    def poisoned(*_):
        raise AssertionError("computed")

    lazy = exact.copy()
    lazy["data"] = exact["data"].copy(data=exact["data"].data.map_blocks(poisoned,
                                                                          dtype=np.float64))
    with pytest.raises(LayoutError, match="complex"):
        svd(lazy.assign(data=lazy["data"].astype(np.complex64)), 2)
    with pytest.raises(LayoutError, match="no variable 'data'"):
        svd(lazy.rename(data="other"), 2)
    with pytest.raises(LayoutError, match="not numbers"):
        svd(lazy.assign(data=lazy["data"] > 0), 2)
    with pytest.raises(OutcoreError, match="rank=0 must be at least 1"):
        svd(lazy, 0)
    with pytest.raises(OutcoreError, match="rank=181 is above"):
        svd(lazy, 181)
    with pytest.raises(OutcoreError, match="power_iterations=-1"):
        svd(lazy, 2, power_iterations=-1)
    values = exact["data"].values.copy()
    values[3, 4, 5, 6] = np.nan
    with pytest.raises(LayoutError, match="NaN or Inf"):  # met in the first read
        svd(exact.copy(data={"data": values}), 2)


def test_the_plan_merges_store_chunks_up_to_what_fits():
    ds = xr.Dataset({"data": (("position", "k_y", "k_x"),
                              da.zeros((100_000, 64, 64), dtype=np.float32,
                                       chunks=(250, 64, 32)))})
    stack = describe(ds)
    assert stack.item_dims == ("position",) and stack.store_chunks == (250, 64, 32)
    chunkings = item_chunkings(stack)
    assert chunkings[:3] == [(250,), (500,), (1000,)] and chunkings[-1] == (100_000,)
    roomy = plan_sketch(stack, Resources(2, 1, 8 * 2**30), 20, 10, 2)
    assert roomy.choices == (4000,)  # 62.5 MiB, the largest block within TASK_BYTES
    assert 4000 * 64 * 64 * 4 <= TASK_BYTES < 8000 * 64 * 64 * 4
    # 1.6 GB decoded: held by 2 x 8 GiB (16 of the 25 blocks a worker at most), not 2 x 1 GiB
    assert roomy.config["hold"] and roomy.resident_bytes == 16 * 4000 * 64 * 64 * 4
    assert roomy.fits and roomy.worker_peak_bytes > roomy.resident_bytes
    middle = plan_sketch(stack, Resources(2, 1, 2**30), 20, 10, 2)
    assert middle.fits and not middle.config["hold"] and middle.resident_bytes == 0
    tight = plan_sketch(stack, Resources(2, 1, 400 * MiB), 20, 10, 2)
    assert tight.fits and tight.choices == (500,) and not tight.config["hold"]
    with pytest.raises(PlanError, match="memory_limit="):
        plan_sketch(stack, Resources(2, 1, 340 * MiB), 20, 10, 2).check()


# --- the verb and the API on other layouts ----------------------------------------------------


def test_the_verb_writes_components_figures_and_a_denoised_store(tmp_path):
    stack, _ = simulate_phases((16, 20), 32, 3, dose=2e4, seed=4, chunk_rows=3)
    outcore.save(stack, tmp_path / "phases.zarr", layout="diffraction")
    assert main(["sketch", "svd", "--input", str(tmp_path / "phases.zarr"), "--rank", "4",
                 "--center", "--denoise", *THREADS, "--output-dir", str(tmp_path),
                 "--name", "run"]) == 0
    run = tmp_path / "run"
    summary = load_summary(run)
    # 1.3 MB of stack: the plan holds it in the workers' memory, read once for 4 passes
    assert summary["status"] == "success" and summary["plan"]["resident_bytes"] > 0
    assert (summary["metrics"]["store_reads"], summary["metrics"]["passes"]) == (1, 4)
    assert len(summary["metrics"]["read_seconds"]) == 4
    assert {o["name"] for o in summary["outputs"]} == {"components.zarr", "scree.png",
                                                        "components.png", "denoised.zarr"}
    for name in ("scree.png", "components.png"):
        assert (run / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    components = xr.open_zarr(run / "components.zarr", consolidated=False).compute()
    assert components["u"].dims == ("scan_y", "scan_x", "component")
    assert components["v"].dims == ("component", "k_y", "k_x")
    assert components["u"].shape == (16, 20, 4) and components["mean"].shape == (32, 32)
    api = svd(outcore.open(tmp_path / "phases.zarr"), 4, center=True)
    # the float32 search's blocks differ between the doors' clusters: the values agree to
    # float64 rounding of float32 products (3.8e-9 seen), well inside the 1e-6 promised
    np.testing.assert_allclose(components["singular_values"].values,
                               api["singular_values"].values, rtol=1e-7)
    ratio = components["explained_variance_ratio"].values  # 3 phases: centred rank 2 + thickness
    assert ratio[:3].sum() > 0.9 and ratio[3] < 0.02
    denoised = outcore.open(run / "denoised.zarr")
    assert denoised.attrs["outcore_layout"] == "diffraction"
    assert denoised["data"].dtype == np.float32
    u, s, v = _factors(components)
    expect = (u * s) @ v.T + components["mean"].values.ravel()
    np.testing.assert_allclose(_matrix(denoised), expect, rtol=1e-5, atol=1e-2)
    again = reconstruct(api, outcore.open(tmp_path / "phases.zarr"))
    np.testing.assert_allclose(_matrix(again), expect, rtol=1e-5, atol=1e-2)


def test_a_cutout_catalog_keeps_its_candidates_and_ids():
    rng = np.random.default_rng(2)
    a = _low_rank(rng, 300, 121, np.array([9.0, 5, 2]))
    catalog = xr.Dataset({"images": (("candidate", "y", "x"),
                                     da.from_array(a.reshape(300, 11, 11), chunks=(64, 11, 11))),
                          "candidate_id": ("candidate", np.arange(300) + 1000)},
                         coords={"candidate": np.arange(300) * 2})
    result = svd(catalog, 3, power_iterations=1)
    assert result.attrs["source_var"] == "images" and result.attrs["tasks_per_read"] == 5
    assert result["u"].dims == ("candidate", "component")
    np.testing.assert_array_equal(result["candidate"].values, np.arange(300) * 2)
    np.testing.assert_array_equal(result["candidate_id"].values, np.arange(300) + 1000)
    np.testing.assert_allclose(result["singular_values"].values, [9, 5, 2], rtol=1e-10)


def test_a_float32_store_gives_numpy_s_values_and_factors_on_any_workers_and_chunking(
        tmp_path, started):
    """An exactly rank-6 float32 stack with a large mean (counts on a background of 1000),
    saved in two chunkings and read from the stores (whole chunks decoded into the blocks,
    the search multiplied in float32), plain and centred: the singular values within 1e-6 of
    numpy's SVD of the same float32 values, the same factors on 1 in-process worker
    streaming the store and on 2 worker processes holding it; the summary's seconds split
    into decoding (only the first pass of a held stack) and products."""
    rng = np.random.default_rng(21)
    a = (_low_rank(rng, 600, 196, np.array([400.0, 150, 60, 25, 9, 4])) + 1000)
    a = a.astype(np.float32)
    paths = []
    for rows in (4, 10):
        paths.append(tmp_path / f"s{rows}.zarr")
        outcore.save(_grid(a, (30, 20), (14, 14), chunk_rows=rows), paths[-1])
    centers = (False, True)
    options = [dict(oversample=5, power_iterations=1, center=center) for center in centers]
    ranks = [5 if center else 6 for center in centers]
    # each cluster once, in turn: the in-process one before the worker processes
    one = started("threads", 1)
    streamed = [svd(paths[0], k, client=one, hold=False, **o)
                for k, o in zip(ranks, options, strict=True)]
    two = started("local", 2)
    held = [svd(paths[1], k, client=two, hold=True, **o)
            for k, o in zip(ranks, options, strict=True)]
    for center, k, s, h in zip(centers, ranks, streamed, held, strict=True):
        exact = a.astype(np.float64)
        if center:
            exact = exact - exact.mean(axis=0)
        sigma = np.linalg.svd(exact, compute_uv=False)[:k]
        for result in (s, h):
            assert np.max(np.abs(result["singular_values"].values / sigma - 1)) < 1e-6
            assert (len(result.attrs["decode_seconds"])
                    == len(result.attrs["product_seconds"]) == 3)
            assert all(p > 0 for p in result.attrs["product_seconds"])
        assert _apart(s, h) < 1e-6
        assert s.attrs["tasks_per_read"] != h.attrs["tasks_per_read"]
        assert all(d > 0 for d in s.attrs["decode_seconds"])
        assert h.attrs["decode_seconds"][0] > 0 and h.attrs["decode_seconds"][1:] == [0, 0]
