"""outcore diffim: the run directory's outputs, one catalog for any tiling and worker count,
and refusals before compute."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import xarray as xr

import outcore
from outcore.cli import main
from outcore.diffim import PsfShape, simulate_pair, write_manifest, write_pair
from outcore.runs import load_summary

COMMON = ["--cluster", "threads", "--no-progress"]


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pairs")
    items = []
    for k in range(2):
        sim = simulate_pair((320, 320), seed=60 + k, stars=30,
                            psf_reference=PsfShape("gaussian", 3.0),
                            psf_target=PsfShape("moffat", 4.0, radius=12),
                            transient_snr=[12.0, 20.0, 30.0], moved=2, mask_boxes=1)
        items.append(write_pair(sim, folder, f"field{k}", psf=k == 0, variance=k == 1))
    return write_manifest(items, folder / "pairs.json")


def _run(tmp_path, name, *args):
    return main(["diffim", *args, *COMMON, "--output-dir", str(tmp_path), "--name", name])


@pytest.fixture(scope="module")
def first_run(tmp_path_factory, manifest):
    """A run of the manifest on 2 workers with tiles of 160 px."""
    runs = tmp_path_factory.mktemp("runs")
    assert _run(runs, "r", "--manifest", str(manifest), "--workers", "2", "--tile", "160") == 0
    return runs / "r"


def test_a_manifest_run_writes_every_output(first_run):
    run = first_run
    summary = load_summary(run)
    assert summary["status"] == "success"
    table = pd.read_parquet(run / "sources.parquet")
    stored = xr.open_zarr(run / "sources.zarr", consolidated=False)
    cutouts = outcore.open(run / "cutouts.zarr", layout="cutouts")
    assert len(table) == stored.sizes["source"] == cutouts.sizes["candidate"] > 8
    np.testing.assert_array_equal(cutouts["source_id"].values, table["source_id"].values)
    assert cutouts.sizes["y"] == cutouts.sizes["x"] == 21
    items = summary["metrics"]["items"]
    for item_id, counts in items.items():
        mine = table[table["item_id"] == item_id]
        assert counts["sources"] == len(mine) and counts["dipoles"] == mine["is_dipole"].sum()
        assert counts["dipoles"] >= 2 and counts["positive"] >= 1
        image = xr.open_zarr(run / "difference.zarr").sel(pair=item_id)
        assert image["difference"].shape == (320, 320)
        assert (run / "png" / f"{item_id}.png").stat().st_size > 10_000
    assert items["field0"]["psf_source"] == ["given", "given"]
    assert all(s.startswith("measured, ") for s in items["field1"]["psf_source"])
    assert np.isfinite(table["ra"]).all() and (table["score_version"] == 1).all()
    assert not [p for p in run.iterdir() if "partial" in p.name]
    roles = {entry["role"] for entry in summary["inputs"]}
    assert {"input", "field0:reference", "field1:target_variance"} <= roles


def test_one_catalog_for_any_tiling_and_worker_count(tmp_path, manifest, first_run):
    assert _run(tmp_path, "a", "--manifest", str(manifest), "--tile", "320",
                "--workers", "1") == 0
    tables = [pd.read_parquet(run / "sources.parquet").sort_values(["item_id", "source_id"])
              .reset_index(drop=True) for run in (tmp_path / "a", first_run)]
    pd.testing.assert_frame_equal(tables[0], tables[1], rtol=1e-6, atol=1e-8)
    one = xr.open_zarr(tmp_path / "a" / "difference.zarr").sel(pair="field1")
    two = xr.open_zarr(first_run / "difference.zarr").sel(pair="field1")
    np.testing.assert_allclose(one["score"].values, two["score"].values, atol=1e-5)


def test_the_one_pair_form(tmp_path, manifest):
    item = json.loads(manifest.read_text())["items"][0]
    base = manifest.parent
    assert _run(tmp_path, "one", "--reference", str(base / item["reference"]["path"]),
                "--target", str(base / item["target"]["path"]),
                "--reference-psf", str(base / item["reference_psf"]["path"]),
                "--target-psf", str(base / item["target_psf"]["path"]),
                "--mask", str(base / item["mask"]["path"]), "--item-id", "solo") == 0
    table = pd.read_parquet(tmp_path / "one" / "sources.parquet")
    assert set(table["item_id"]) == {"solo"} and len(table) >= 5


def test_no_star_and_no_fwhm_for_a_psf_is_refused_before_any_tile(tmp_path, capsys):
    """An image without a star gives no PSF (one star would: a Moffat fit) unless a FWHM is
    given: refused after the survey, naming --fwhm and --reference-psf."""
    sim = simulate_pair((128, 128), seed=3, stars=0, margin=20.0)
    folder = tmp_path / "inputs"
    item = write_pair(sim, folder, "empty", psf=False)
    item["flux_ratio"] = 1.0
    path = write_manifest([item], folder / "pairs.json")
    assert _run(tmp_path, "few", "--manifest", str(path)) == 1
    err = capsys.readouterr().err
    assert "no isolated star" in err and "--reference-psf" in err and "--fwhm" in err
    summary = load_summary(tmp_path / "few")
    assert summary["status"] == "failed"
    assert not (tmp_path / "few" / "difference.zarr").exists()
    assert not [p for p in (tmp_path / "few").iterdir() if p.suffix in (".zarr", ".parquet")]


def test_refusals_before_the_cluster_starts(tmp_path, manifest, capsys):
    runs = tmp_path / "runs"
    assert _run(runs, "x", "--manifest", str(manifest), "--stamp", "20") == 1
    assert "--stamp 20 must be odd" in capsys.readouterr().err
    assert _run(runs, "x", "--manifest", str(manifest), "--reference", "a.fits") == 1
    assert "not both" in capsys.readouterr().err
    assert _run(runs, "x", "--manifest", str(manifest), "--zeropoint", "25") == 1
    assert "--zeropoint applies to the one-pair form only" in capsys.readouterr().err
    # under a difference-imaging worker's own baseline (300 MiB): refused as such
    assert _run(runs, "x", "--manifest", str(manifest), "--memory-limit", "400MiB") == 1
    assert "--memory-limit 500MiB or more" in capsys.readouterr().err
    assert _run(runs, "x", "--manifest", str(manifest), "--memory-limit", "500MiB",
                "--tile", "4096") == 1
    assert "does not fit" in capsys.readouterr().err
    record = json.loads(manifest.read_text())
    record["items"][0]["target"]["sha256"] = "0" * 64
    bad = manifest.parent / "bad.json"
    bad.write_text(json.dumps(record))
    assert _run(runs, "x", "--manifest", str(bad)) == 1
    assert "field0:target" in capsys.readouterr().err
    assert not runs.exists()
