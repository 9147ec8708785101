"""outcore fit-dipoles: a run directory with fits.parquet, fits.zarr and status counts."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import xarray as xr

import outcore
from outcore.cli import main
from outcore.fit import simulate_catalog
from outcore.runs import load_summary

COMMON = ["--cluster", "threads", "--workers", "2", "--no-progress"]


@pytest.fixture(scope="module")
def catalog():
    return simulate_catalog(300, seed=5)


def test_fit_dipoles_from_an_npz_catalog(tmp_path, catalog):
    cat, truth = catalog
    source = tmp_path / "cat.npz"
    images = cat["images"].values.copy()
    images[7, 3, 3] = np.nan  # one bad candidate
    np.savez(source, candidate_id=cat["candidate_id"].values, images=images,
             variance=cat["variance"].values)
    code = main(["fit-dipoles", "--input", str(source), "--chunk-size", "64", *COMMON,
                 "--output-dir", str(tmp_path), "--name", "f"])
    assert code == 0
    summary = load_summary(tmp_path / "f")
    counts = summary["metrics"]["status_counts"]
    assert counts["invalid_input"] == 1 and sum(counts.values()) == 300
    assert summary["metrics"]["fits_per_second"] > 0
    table = pd.read_parquet(tmp_path / "f" / "fits.parquet")
    assert len(table) == 300 and table.loc[7, "status"] == "invalid_input"
    assert {"candidate_id", "status", "iterations", "chi2", "dof", "x_pos", "x_pos_err",
            "flux_neg", "sigma_err"} <= set(table.columns)
    fits = xr.open_zarr(tmp_path / "f" / "fits.zarr", consolidated=False)
    np.testing.assert_array_equal(fits["chi2"].values, table["chi2"].values)
    good = table["status"].str.startswith("converged").to_numpy()
    pulls = (table["x_pos"] - truth["x_pos"].values) / table["x_pos_err"]
    assert 0.7 < np.std(pulls[good]) < 1.3  # errors describe the scatter


def test_chunk_size_does_not_change_the_fits(tmp_path, catalog):
    cat, _ = catalog
    store = tmp_path / "cat.zarr"
    outcore.save(cat, store)
    tables = []
    for chunk in ("7", "300"):
        assert main(["fit-dipoles", "--input", str(store), "--chunk-size", chunk, *COMMON,
                     "--output-dir", str(tmp_path), "--name", f"c{chunk}"]) == 0
        tables.append(pd.read_parquet(tmp_path / f"c{chunk}" / "fits.parquet"))
    pd.testing.assert_frame_equal(tables[0], tables[1])


def test_the_default_chunk_size_is_recorded_and_gives_the_same_fits(tmp_path, catalog):
    """No --chunk-size: the automatic one (300 stamps -> 32 a task, 8 or more tasks) is the
    run's recorded chunk size, and the fits equal those of an explicit one."""
    from outcore.fit.memory import auto_chunk_size

    cat, _ = catalog
    store = tmp_path / "cat.zarr"
    outcore.save(cat, store)
    assert main(["fit-dipoles", "--input", str(store), *COMMON, "--output-dir", str(tmp_path),
                 "--name", "auto"]) == 0
    assert main(["fit-dipoles", "--input", str(store), "--chunk-size", "300", *COMMON,
                 "--output-dir", str(tmp_path), "--name", "one"]) == 0
    assert load_summary(tmp_path / "auto")["config"]["chunk_size"] == 32
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "auto" / "fits.parquet"),
                                  pd.read_parquet(tmp_path / "one" / "fits.parquet"))
    assert auto_chunk_size(30_000, (17, 17)) == 2048
    assert auto_chunk_size(10**7, (17, 17)) == 4096
    assert auto_chunk_size(10**7, (128, 128)) == 128  # 16 MiB of float64 stamps
    assert auto_chunk_size(5, (17, 17)) == 1


def test_outputs_are_chunked_for_storage_not_for_compute(tmp_path, catalog, monkeypatch):
    """fits.zarr in chunks of STORAGE_ROWS rows (whatever --chunk-size), fits.parquet in row
    groups of as many; the same table as one stored chunk."""
    import pyarrow.parquet as pq
    import zarr

    from outcore.fit import tables as fit_tables

    cat, _ = catalog
    store = tmp_path / "cat.zarr"
    outcore.save(cat, store)
    tables = {}
    for rows in (128, 65536):
        monkeypatch.setattr(fit_tables, "STORAGE_ROWS", rows)
        assert main(["fit-dipoles", "--input", str(store), "--chunk-size", "16", *COMMON,
                     "--output-dir", str(tmp_path), "--name", f"r{rows}"]) == 0
        run = tmp_path / f"r{rows}"
        expected = min(rows, 300)
        assert zarr.open_array(run / "fits.zarr" / "chi2", mode="r").chunks == (expected,)
        groups = pq.ParquetFile(run / "fits.parquet").metadata
        assert groups.num_row_groups == -(-300 // expected)
        assert groups.row_group(0).num_rows == expected
        tables[rows] = pd.read_parquet(run / "fits.parquet")
    pd.testing.assert_frame_equal(tables[128], tables[65536])


def test_bad_catalog_is_refused_before_anything(tmp_path, capsys):
    source = tmp_path / "cat.npz"
    np.savez(source, candidate_id=np.arange(3), images=np.zeros((3, 9, 9)),
             variance=np.ones((3, 9, 8)))
    assert main(["fit-dipoles", "--input", str(source), *COMMON,
                 "--output-dir", str(tmp_path / "runs")]) == 1
    assert "variance" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_psf_model_needs_a_psf(tmp_path, capsys, catalog):
    store = tmp_path / "cat.zarr"
    outcore.save(catalog[0], store)
    assert main(["fit-dipoles", "--input", str(store), "--model", "psf", *COMMON,
                 "--output-dir", str(tmp_path / "runs")]) == 1
    assert "psf" in capsys.readouterr().err.lower()
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(("flags", "words"), [
    ([], "cluster: threads, dask's threaded scheduler in this process, no dashboard"
         " (--dashboard serves one)"),
    (["--dashboard"], "cluster: threads, dashboard http://127.0.0.1:"),
    (["--cluster", "local", "--workers", "1"], "cluster: local, dashboard http://127.0.0.1:"),
])
def test_the_dashboard_is_served_for_worker_processes_and_when_asked(tmp_path, catalog,
                                                                      capsys, flags, words):
    """Worker processes and an asked-for dashboard print and record its loopback link; in-
    process workers print in one line how to get one, and record none."""
    cat, _ = catalog
    source = tmp_path / "cat.npz"
    np.savez(source, candidate_id=cat["candidate_id"].values[:16],
             images=cat["images"].values[:16], variance=cat["variance"].values[:16])
    kind = ["--cluster", "threads"] if "--cluster" not in flags else []
    assert main(["fit-dipoles", "--input", str(source), "--no-progress", *kind, *flags,
                 "--output-dir", str(tmp_path), "--name", "d"]) == 0
    assert words in capsys.readouterr().out
    dashboard = load_summary(tmp_path / "d")["cluster"]["dashboard"]
    assert (dashboard is None) == (flags == [])
    assert dashboard is None or dashboard.startswith("http://127.0.0.1:")
