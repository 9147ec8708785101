"""outcore tomo simulate / reconstruct: stores, run directories, PSNR, resume, refusals.

Small scans (32^3 voxels) on a threads cluster of 2 workers. PSNR is against the phantom's
peak; measured here: FBP 21.4 dB (48 parallel views), FDK 19.1 dB on the central half of z
(64 cone views), CGLS 20.4 dB after 4 iterations.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import outcore
from outcore.cli import main
from outcore.runs import load_summary
from outcore.tomo import Geometry, Projector, shepp_logan

N = 32
COMMON = ["--cluster", "threads", "--workers", "2", "--no-progress"]
SCANS = {"parallel": 48, "cone": 64}


def _psnr(image: np.ndarray, truth: np.ndarray) -> float:
    return float(10 * np.log10(truth.max() ** 2 / np.mean((image - truth) ** 2)))


def _volume(run_dir: Path) -> np.ndarray:
    return outcore.open(run_dir / "volume.zarr", layout="volume")["volume"].values


@pytest.fixture(scope="module")
def phantom() -> np.ndarray:
    return shepp_logan((N, N, N)).compute()


@pytest.fixture(scope="module")
def scans(tmp_path_factory) -> dict[str, Path]:
    """A simulated Shepp-Logan scan of each geometry: kind -> projections store."""
    root = tmp_path_factory.mktemp("scans")
    stores = {}
    for kind, views in SCANS.items():
        store = root / f"{kind}.zarr"
        assert main(["tomo", "simulate", "--phantom", "shepp-logan", "--shape", *[str(N)] * 3,
                     "--views", str(views), "--geometry", kind, "--output", str(store),
                     *COMMON, "--output-dir", str(root / "runs"), "--name", kind]) == 0
        stores[kind] = store
    return stores


def _reconstruct(tmp_path: Path, store: Path, name: str, *options: str) -> Path:
    assert main(["tomo", "reconstruct", "--input", str(store), *options, *COMMON,
                 "--output-dir", str(tmp_path), "--name", name]) == 0
    return tmp_path / name


@pytest.mark.parametrize("kind", SCANS)
def test_simulate_writes_the_projections_store_and_its_run(scans, kind):
    store = scans[kind]
    ds = outcore.open(store, layout="projections")
    summary = load_summary(store.parent / "runs" / kind)
    assert summary["status"] == "success"
    assert [o["path"] for o in summary["outputs"]] == [str(store)]
    assert summary["metrics"]["gups"] > 0
    geometry = Geometry.from_attrs(ds)
    assert geometry.kind == kind and geometry.n_views == SCANS[kind]
    assert ds.attrs["volume_shape"] == [N, N, N] and ds.attrs["voxel_size"] == 1e-3
    # the store holds the projector's projection of the phantom, with the run's blocks
    config = summary["config"]
    projector = Projector(geometry, (N, N, N), config["partition"],
                          config["views_per_block"], config["slab"])
    expected = projector.project(shepp_logan((N, N, N))).compute(scheduler="sync")
    np.testing.assert_allclose(ds["projections"].values, expected, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize(("kind", "options", "floor"), [
    ("parallel", [], 20.0),
    ("parallel", ["--window", "shepp-logan", "--partition", "space"], 19.5),
    ("cone", [], 18.0),
])
def test_fbp_reaches_its_psnr(tmp_path, scans, phantom, kind, options, floor):
    run = _reconstruct(tmp_path, scans[kind], "fbp", "--method", "fbp", *options)
    summary = load_summary(run)
    assert summary["status"] == "success"
    assert {o["name"] for o in summary["outputs"]} == {"volume.zarr", "slices.png"}
    metrics = summary["metrics"]
    assert metrics["projector_passes"] == 1 and metrics["gups"] > 0 and metrics["seconds"] > 0
    volume = _volume(run)
    # FDK is exact only in the plane of the source orbit: judge the central half of z
    keep = slice(N // 4, 3 * N // 4) if kind == "cone" else slice(None)
    assert _psnr(volume[keep], phantom[keep]) > floor
    assert volume.mean() == pytest.approx(phantom.mean(), rel=0.02)


def test_cgls_resumed_equals_uninterrupted(tmp_path, scans, phantom):
    store = scans["parallel"]
    blocks = ["--partition", "space", "--slab", "8"]
    whole = _reconstruct(tmp_path, store, "whole", "--method", "cgls", "--iterations", "4",
                         *blocks)
    half = _reconstruct(tmp_path, store, "half", "--method", "cgls", "--iterations", "2",
                        "--checkpoint-every", "2", *blocks)
    # no block options: the resumed run takes the earlier run's partition and blocks
    rest = _reconstruct(tmp_path, store, "rest", "--method", "cgls", "--iterations", "4",
                        "--resume", "--resume-from", str(half))
    np.testing.assert_array_equal(_volume(rest), _volume(whole))
    first, resumed = load_summary(whole)["metrics"], load_summary(rest)["metrics"]
    residuals = first["residuals"]
    assert len(residuals) == 5 and all(np.diff(residuals) < 0)
    assert resumed["residuals"] == residuals
    assert resumed["resumed_from_iteration"] == 2 and resumed["iterations"] == 4
    assert resumed["projector_passes"] == 4 and first["projector_passes"] == 9
    config = load_summary(rest)["config"]
    assert (config["partition"], config["slab"]) == ("space", 8)
    assert _psnr(_volume(whole), phantom) > 19.0
    # the earlier run's work directory is left as it was; each run has its own
    assert json.loads((half / "work" / "state.json").read_text())["iteration"] == 2
    assert json.loads((rest / "work" / "state.json").read_text())["iteration"] == 4


def test_state_in_memory_when_it_fits_and_on_disk_give_one_volume(tmp_path, scans):
    store = scans["parallel"]
    common = ["--method", "cgls", "--iterations", "3", "--slab", "8"]
    auto = _reconstruct(tmp_path, store, "auto", *common)
    disk = _reconstruct(tmp_path, store, "disk", *common, "--state", "disk")
    np.testing.assert_array_equal(_volume(auto), _volume(disk))
    assert load_summary(auto)["metrics"]["residuals"] == load_summary(disk)["metrics"][
        "residuals"]
    memory, zarr_backed = load_summary(auto), load_summary(disk)
    assert (memory["config"]["state"], memory["config"]["checkpoint_every"]) == ("memory", 10)
    assert (zarr_backed["config"]["state"], zarr_backed["config"]["checkpoint_every"]) == (
        "disk", 1)
    assert memory["plan"]["resident_bytes"] > 0 == zarr_backed["plan"]["resident_bytes"]


def test_sirt_writes_its_work_dir_and_residuals(tmp_path, scans):
    run = _reconstruct(tmp_path, scans["cone"], "sirt", "--method", "sirt", "--iterations", "3")
    metrics = load_summary(run)["metrics"]
    assert len(metrics["residuals"]) == 3 and all(np.diff(metrics["residuals"]) < 0)
    assert (run / "work" / "state.json").is_file() and metrics["projector_passes"] == 8


def test_plan_prints_without_running(scans, capsys):
    assert main(["plan", "tomo", "reconstruct", "--input", str(scans["cone"]), "--method",
                 "cgls", "--memory-limit", "1GiB", "--workers", "2"]) == 0
    out = capsys.readouterr().out
    assert "backproject" in out and "update-volume" in out and "fits" in out


def _no_geometry(tmp_path: Path) -> Path:
    store = tmp_path / "bare.zarr"
    xr.Dataset({"projections": (("view", "v", "u"), np.zeros((4, 8, 8), np.float32)),
                "angles": ("view", np.zeros(4))},
               attrs={"detector_pixel_size": 1.0}).to_zarr(store, zarr_format=3,
                                                           consolidated=False)
    return store


BAD = {
    "method": (["--method", "art"], "--method"),
    "iterations": (["--method", "cgls", "--iterations", "0"], "--iterations"),
    "checkpoint": (["--method", "sirt", "--checkpoint-every", "0"], "--checkpoint-every"),
    "window-cgls": (["--method", "cgls", "--window", "hann"], "--window"),
    "window": (["--window", "cosine"], "--window"),
    "fbp-iterations": (["--iterations", "3"], "--iterations"),
    "partition": (["--partition", "rows"], "--partition"),
    "resume-alone": (["--method", "cgls", "--resume"], "--resume-from"),
    "state": (["--method", "cgls", "--state", "ram"], "--state"),
    "state-fbp": (["--state", "memory"], "--state"),
    "resume-from-alone": (["--method", "cgls", "--resume-from", "."], "--resume"),
    "not-a-run": (["--method", "cgls", "--resume", "--resume-from", "{tmp}"], "summary.json"),
    "volume": (["--volume-shape", "32", "0", "32"], "--volume-shape"),
    "geometry": (["--input", "{bare}"], "geometry"),
    "input": (["--input", "{tmp}/missing.zarr"], "does not exist"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_reconstruct_input_is_refused_before_anything(tmp_path, scans, capsys, case):
    options, word = BAD[case]
    fill = {"tmp": str(tmp_path), "bare": str(_no_geometry(tmp_path))}
    options = [o.format(**fill) for o in options]
    source = [] if "--input" in options else ["--input", str(scans["parallel"])]
    assert main(["tomo", "reconstruct", *source, *options, *COMMON,
                 "--output-dir", str(tmp_path / "runs")]) == 1
    err = capsys.readouterr().err
    assert word in err and "Fix:" in err
    assert not (tmp_path / "runs").exists()


def test_resume_refuses_another_method_or_a_finished_total(tmp_path, scans, capsys):
    store = scans["parallel"]
    run = _reconstruct(tmp_path, store, "sirt", "--method", "sirt", "--iterations", "2")
    for options, word in ((["--method", "cgls", "--iterations", "4"], "--method sirt"),
                          (["--method", "sirt", "--iterations", "1"], "--iterations 2"),
                          (["--method", "sirt", "--partition", "space"], "--partition")):
        assert main(["tomo", "reconstruct", "--input", str(store), *options, "--resume",
                     "--resume-from", str(run), *COMMON,
                     "--output-dir", str(tmp_path / "runs")]) == 1
        assert word in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(("options", "word"), [
    (["--phantom", "cube"], "--phantom"),
    (["--geometry", "fan"], "--geometry"),
    (["--views", "0"], "--views"),
    (["--voxel-size", "0"], "--voxel-size"),
    (["--output", "{existing}"], "already exists"),
])
def test_bad_simulate_input_is_refused_before_anything(tmp_path, scans, capsys, options,
                                                       word):
    options = [o.format(existing=scans["parallel"]) for o in options]
    output = [] if "--output" in options else ["--output", str(tmp_path / "p.zarr")]
    assert main(["tomo", "simulate", "--shape", "8", "8", "8", *output, *options, *COMMON,
                 "--output-dir", str(tmp_path / "runs")]) == 1
    assert word in capsys.readouterr().err
    assert not (tmp_path / "runs").exists() and not (tmp_path / "p.zarr").exists()
