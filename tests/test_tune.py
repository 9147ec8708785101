"""outcore tune: a grid of chunk sizes x worker counts, timed, with memory and efficiency."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

import outcore
from outcore import cli, cluster, demo, tune
from outcore.errors import OutcoreError, RunExistsError
from outcore.fit import simulate_catalog
from outcore.runs import load_summary

LIMIT = 512 * 2**20
PNG = b"\x89PNG\r\n\x1a\n"


def outcore_tune(argv: list[str]) -> int:
    """``outcore tune ...`` as the outcore command dispatches it."""
    return tune.run_cli(cli.build_parser("tune").parse_args(["tune", *argv]))


def test_demo_grid_from_the_command_line(tmp_path, capsys):
    code = outcore_tune(["demo", "--scan", "8", "16", "--frame", "32", "--fit-candidates", "0",
                         "--chunk-size", "4", "2", "--workers", "2", "1", "--measure-rounds",
                         "2", "--output-dir", str(tmp_path), "--name", "t", "--no-progress"])
    assert code == 0
    run = tmp_path / "t"
    assert (run / "tune.png").read_bytes()[:8] == PNG
    assert not (run / "scratch").exists()
    ds = xr.open_zarr(run / "tune.zarr", consolidated=False).load()
    assert dict(ds.sizes) == {"workers": 2, "chunk": 2}
    assert ds["workers"].values.tolist() == [1, 2] and ds["chunk"].values.tolist() == [2, 4]
    assert ds["fits"].all() and (ds["throughput"] > 0).all()
    gigabytes = 8 * 16 * 32 * 32 * 4 / 1e9  # float32 frames one pass reads
    np.testing.assert_allclose(ds["throughput"] * ds["median_s"], gigabytes)
    assert ((ds["min_s"] <= ds["median_s"]) & (ds["median_s"] <= ds["max_s"])).all()
    assert ((ds["peak_worker_bytes"] > 50 * 2**20) & (ds["peak_worker_bytes"] < LIMIT)).all()
    assert (ds["efficiency"].sel(workers=1) == 1.0).all()
    np.testing.assert_allclose(ds["efficiency"].sel(workers=2),
                               ds["throughput"].sel(workers=2) / (2 * ds["throughput"][0]))
    summary = load_summary(run)
    assert summary["status"] == "success" and summary["command"] == "tune"
    best = summary["metrics"]["best"]
    assert (best["workers"], best["chunk"]) in [(w, c) for w in (1, 2) for c in (2, 4)]
    assert best["throughput"] == pytest.approx(float(ds["throughput"].max()))
    assert summary["config"]["verb_config"]["scan"] == [8, 16]
    assert len(summary["cluster"]["runs"]) == 2
    assert f"best point: workers {best['workers']}" in capsys.readouterr().out


def test_a_chunk_whose_plan_cannot_fit_is_skipped_not_run(tmp_path, monkeypatch):
    staged = []

    def spy(path, scan, frame, chunk_rows, **kw):
        staged.append(chunk_rows)
        return write_stack(path, scan, frame, chunk_rows, **kw)

    write_stack = demo.write_stack
    monkeypatch.setattr(demo, "write_stack", spy)
    # frames of 1 MiB: one scan row a chunk is small; 16 rows need ~200 MiB a task, over
    # the 307 MiB budget (60 % of 512 MiB) with the worker's baseline
    ds = tune.tune("demo", [1, 16], [1], scan=(16, 4), frame=512, fit_candidates=0,
                   memory_limit="512MiB", warmup_rounds=0, measure_rounds=1,
                   output_dir=tmp_path, name="t", no_progress=True)
    assert staged == [1]
    assert ds["fits"].values.tolist() == [[True, False]]
    skipped = ds.sel(workers=1, chunk=16)
    assert np.isnan(skipped["median_s"]) and np.isnan(skipped["peak_worker_bytes"])
    assert skipped["projected_worker_bytes"] > 0.6 * LIMIT
    assert ds.attrs["best_chunk"] == 1
    summary = load_summary(tmp_path / "t")
    assert summary["status"] == "success"
    assert any("chunk=16: skipped" in note and "does not fit" in note
               for note in summary["metrics"]["notes"])


def test_fit_dipoles_grid_from_python(tmp_path):
    store = tmp_path / "cat.zarr"
    outcore.save(simulate_catalog(400, seed=1)[0], store)
    ds = tune.tune("fit-dipoles", [100, 200], [1, 2], input=str(store), cluster="threads",
                   warmup_rounds=0, measure_rounds=1, output_dir=tmp_path / "runs", name="f",
                   no_progress=True)
    assert ds.attrs["units"] == "fits/s" and ds["fits"].all()
    np.testing.assert_allclose(ds["throughput"] * ds["median_s"], 400)
    assert (ds["efficiency"].sel(workers=1) == 1.0).all()
    assert ds.attrs["best_throughput"] == pytest.approx(float(ds["throughput"].max()))
    summary = load_summary(tmp_path / "runs" / "f")
    assert summary["inputs"][0]["path"] == str(store.resolve())


def test_tomo_reconstruct_grid_on_a_synthetic_scan(tmp_path):
    code = outcore_tune(["tomo", "reconstruct", "--shape", "16", "16", "16", "--views", "24",
                         "--chunk-size", "8", "24", "--workers", "1", "2", "--cluster",
                         "threads", "--warmup-rounds", "0", "--measure-rounds", "1",
                         "--output-dir", str(tmp_path), "--name", "t", "--no-progress"])
    assert code == 0
    run = tmp_path / "t"
    assert [p.name for p in tmp_path.iterdir()] == ["t"]  # the synthetic scan is removed
    ds = xr.open_zarr(run / "tune.zarr", consolidated=False).load()
    assert ds.attrs["verb"] == "tomo reconstruct" and ds.attrs["units"] == "GUPS"
    assert ds["chunk"].values.tolist() == [8, 24] and ds["fits"].all()
    np.testing.assert_allclose(ds["throughput"] * ds["median_s"], 16**3 * 24 / 1e9)
    assert (ds["efficiency"].sel(workers=1) == 1.0).all()
    summary = load_summary(run)
    assert summary["status"] == "success" and summary["config"]["chunk_option"] == \
        "views_per_block"
    assert summary["config"]["verb_config"]["method"] == "fbp"


def test_ptycho_reconstruct_grid_of_sub_batches(tmp_path):
    from outcore.ptycho import preprocess, save_preprocessed, simulate

    from .ptycho_cases import local_client

    with local_client() as client:
        stack, _ = simulate((6, 6), detector=32, step=5, jitter=1).save(tmp_path / "s.zarr")
        pre = save_preprocessed(preprocess(stack, client=client), tmp_path / "p.zarr")
    ds = tune.tune("ptycho reconstruct", [4, 36], [1, 2], input=str(pre), iterations=2,
                   batch_size=12, cluster="threads", warmup_rounds=0, measure_rounds=1,
                   output_dir=tmp_path / "runs", name="p", no_progress=True)
    assert ds.attrs["units"] == "patterns/s" and ds["fits"].all()
    np.testing.assert_allclose(ds["throughput"] * ds["median_s"], 36 * 2)
    assert load_summary(tmp_path / "runs" / "p")["config"]["chunk_option"] == "sub_batch"


@pytest.fixture
def no_cluster(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a cluster was started")

    monkeypatch.setattr(cluster, "start", refuse)


def test_refusals_come_before_anything_starts(tmp_path, no_cluster):
    grid = ["--chunk-size", "2", "--workers", "1", "--output-dir", str(tmp_path)]
    with pytest.raises(OutcoreError, match="demo, fit-dipoles"):
        outcore_tune(["convert", *grid])
    (tmp_path / "taken").mkdir()
    with pytest.raises(RunExistsError):
        outcore_tune(["demo", *grid, "--name", "taken"])
    with pytest.raises(OutcoreError, match="missing.zarr"):
        outcore_tune(["fit-dipoles", "--input", str(tmp_path / "missing.zarr"), *grid])
    with pytest.raises(OutcoreError, match="--workers"):
        outcore_tune(["demo", "--chunk-size", "2", "--workers", "0", "1"])
    with pytest.raises(OutcoreError, match="FBP round"):
        outcore_tune(["tomo", "reconstruct", "--method", "cgls", *grid])
    with pytest.raises(OutcoreError, match="--shape makes the synthetic scan"):
        outcore_tune(["tomo reconstruct", "--input", str(tmp_path / "p.zarr"), "--shape", "8",
                      "8", "8", *grid])
    assert [p.name for p in tmp_path.iterdir()] == ["taken"]
