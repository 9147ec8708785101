"""outcore tomo convert: a raw HDF5 scan -> projections store -> tomo reconstruct.

A 16^3 Shepp-Logan phantom (1/m, voxels of 1 mm) is projected over 32 parallel views; the
frames written to a Data Exchange file are ``dark + (flat - dark) * exp(-p)`` in float32, so
the converted store must hold ``p = -log(transmission)`` to float32 rounding, and FBP of it must
give back the phantom.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

import outcore
from outcore.cli import main
from outcore.io.importers.hdf5 import HDF5Frames
from outcore.runs import load_summary
from outcore.tomo import Geometry, kernels, scan_for, shepp_logan

h5py = pytest.importorskip("h5py")

N, VIEWS, VOXEL, MU = 16, 32, 1e-3, 200.0  # voxels, views, m, 1/m at the phantom's peak
COMMON = ["--cluster", "threads", "--workers", "1", "--no-progress"]


@pytest.fixture(scope="module")
def scan(tmp_path_factory) -> dict:
    """A raw scan of the phantom in a Data Exchange file, and its truth."""
    root = tmp_path_factory.mktemp("beamline")
    volume = (MU * shepp_logan((N, N, N))).compute().astype(np.float32)
    geometry = scan_for("parallel", (N, N, N), VIEWS, voxel_size=VOXEL)
    p = kernels.forward(volume, geometry.angles, geometry).astype(np.float64)
    transmission = np.exp(-p)
    rng = np.random.default_rng(1)
    nv, nu = geometry.detector_shape
    dark = 90.0 + 20.0 * rng.random((4, nv, nu))
    flat = 3000.0 + 500.0 * rng.random((6, nv, nu))
    mean_dark, mean_flat = dark.mean(0), flat.mean(0)
    raw = (mean_dark + (mean_flat - mean_dark) * transmission).astype(np.float32)
    # the store's truth: the float32 frames as written, normalised in float64
    expected = -np.log((raw.astype(np.float64) - mean_dark) / (mean_flat - mean_dark))
    path = root / "scan.h5"
    with h5py.File(path, "w") as f:
        f["/exchange/data"] = raw
        f["/exchange/data_white"] = flat
        f["/exchange/data_dark"] = dark
        f["/exchange/theta"] = np.degrees(geometry.angles)
    return {"path": path, "root": root, "volume": volume, "geometry": geometry,
            "expected": expected, "transmission": transmission}


def _convert(out: Path, runs: Path, source: Path, *options: str) -> int:
    return main(["tomo", "convert", str(source), str(out), *options, *COMMON,
                 "--output-dir", str(runs)])


@pytest.fixture(scope="module")
def store(scan) -> Path:
    out = scan["root"] / "proj.zarr"
    assert _convert(out, scan["root"] / "runs", scan["path"], "--layout", "projections",
                    "--attr", f"detector_pixel_size={VOXEL}",
                    "--frames-per-chunk", "8", "--name", "convert") == 0
    return out


def test_convert_writes_minus_log_transmission(scan, store):
    ds = outcore.open(store, layout="projections", check_values=True)
    proj = ds["projections"]
    assert proj.dims == ("view", "v", "u") and proj.dtype == np.float32
    assert proj.shape == scan["geometry"].projection_shape
    # float32 normalisation of float32 frames: equal to -log(T) to float32 rounding
    np.testing.assert_allclose(proj.values, scan["expected"], rtol=0, atol=2e-6)
    np.testing.assert_allclose(proj.values, -np.log(scan["transmission"]), rtol=0, atol=2e-5)
    np.testing.assert_allclose(ds["angles"].values, scan["geometry"].angles, rtol=1e-12)
    assert ds.attrs["geometry"] == "parallel" and ds.attrs["detector_pixel_size"] == VOXEL
    assert proj.attrs["raw_dtype"] == "float32"
    geometry = Geometry.from_attrs(ds)  # what tomo reconstruct reads: pixel = voxel = 1 mm
    assert geometry.to_attrs() == scan["geometry"].to_attrs()
    assert geometry.detector_shape == scan["geometry"].detector_shape
    summary = load_summary(scan["root"] / "runs" / "convert")
    assert summary["status"] == "success" and summary["config"]["layout"] == "projections"
    assert summary["command"] == "tomo convert"
    assert summary["plan"]["stages"][0]["name"] == "read-and-normalise"
    assert summary["config"]["beamline"] == {}
    assert [o["path"] for o in summary["outputs"]] == [str(store.resolve())]


def test_fbp_of_the_converted_store_gives_the_phantom(scan, store, tmp_path):
    assert main(["tomo", "reconstruct", "--input", str(store), "--method", "fbp",
                 "--volume-shape", str(N), str(N), str(N), *COMMON,
                 "--output-dir", str(tmp_path), "--name", "fbp"]) == 0
    volume = outcore.open(tmp_path / "fbp" / "volume.zarr", layout="volume")["volume"].values
    truth = scan["volume"]
    assert volume.shape == truth.shape and np.isfinite(volume).all()
    psnr = 10 * math.log10(truth.max() ** 2 / np.mean((volume - truth) ** 2))
    assert psnr > 20.0, psnr  # 22.7 dB measured
    # the mean attenuation (1/m) is kept: FBP preserves the volume's integral
    assert abs(volume.mean() / truth.mean() - 1) < 0.05


def test_streams_block_by_block_and_reads_only_metadata_before(scan, tmp_path, monkeypatch):
    reads: list[tuple[int, int]] = []
    original = HDF5Frames.read
    monkeypatch.setattr(HDF5Frames, "read",
                        lambda self, a, b: reads.append((a, b)) or original(self, a, b))
    assert main(["plan", "tomo", "convert", str(scan["path"]), str(tmp_path / "p.zarr"),
                 "--attr", f"detector_pixel_size={VOXEL}", "--frames-per-chunk", "8",
                 "--memory-limit", "1GiB", "--workers", "1"]) == 0
    assert reads == []  # planning reads no frame
    assert _convert(tmp_path / "p.zarr", tmp_path / "runs", scan["path"],
                    "--attr", f"detector_pixel_size={VOXEL}", "--frames-per-chunk", "8",
                    "--darks", "none", "--angles-unit", "deg") == 0
    assert sorted(reads) == [(0, 8), (8, 16), (16, 24), (24, 32)]  # each frame read once


def test_cone_geometry_and_radian_angles(scan, tmp_path):
    path = tmp_path / "cone.h5"
    with h5py.File(scan["path"]) as src, h5py.File(path, "w") as f:
        f["/entry/frames"] = src["/exchange/data"][()]
        f["/entry/flat"] = src["/exchange/data_white"][()].mean(0)  # one frame
        f["/entry/dark"] = src["/exchange/data_dark"][()]
        f["/entry/rot"] = scan["geometry"].angles
    out = tmp_path / "cone.zarr"
    assert _convert(out, tmp_path / "runs", path, "--dataset", "/entry/frames",
                    "--flats", "/entry/flat", "--darks", "/entry/dark", "--angles",
                    "/entry/rot", "--angles-unit", "rad", "--attr", "geometry=cone",
                    "--attr", "detector_pixel_size=2e-3,1e-3", "--attr", "source_distance=0.5",
                    "--attr", "detector_distance=0.25", "--attr", "detector_offset=0,1e-4",
                    "--chunk", "view=16") == 0
    ds = outcore.open(out, layout="projections")
    geometry = Geometry.from_attrs(ds)
    assert geometry.kind == "cone" and geometry.detector_pixel_size == (2e-3, 1e-3)
    assert (geometry.source_distance, geometry.detector_distance) == (0.5, 0.25)
    assert geometry.detector_offset == (0.0, 1e-4)
    np.testing.assert_allclose(ds["angles"].values, scan["geometry"].angles, rtol=1e-12)
    assert ds["projections"].data.chunks[0] == (16, 16)


def _edit(path: Path, name: str, value: np.ndarray) -> None:
    with h5py.File(path, "a") as f:
        del f[name]
        f[name] = value


@pytest.mark.parametrize(("options", "edit", "message"), [
    (["--attr", "geometry=cone", "--attr", "source_distance=1", "--attr",
      "detector_distance=1"], None, "cone-beam scan needs the detector pixel size"),
    (["--attr", "detector_pixel_size=1e-3", "--flats", "/exchange/white"], None,
     "The flats of the scan: .* has no dataset '/exchange/white'.*--flats one of those"),
    (["--attr", "detector_pixel_size=1e-3", "--dataset", "/entry/data"], None,
     "The data of the scan: .*--dataset one of those"),
    (["--attr", "detector_pixel_size=1e-3"], ("/exchange/data_white", np.ones((2, 3, 4))),
     "flats '/exchange/data_white' has shape \\(2, 3, 4\\)"),
    (["--attr", "detector_pixel_size=1e-3"], ("/exchange/theta", np.zeros(5)),
     "holds 5 angles but '/exchange/data' holds 32 frames"),
    (["--attr", "detector_pixel_size=1e-3"], ("/exchange/data_white", np.full((2, 16, 26), 50.)),
     "zero or negative at every pixel"),
    (["--attr", "detector_pixel_size=1e-3", "--attr", "geometry=cone"], None,
     "needs source_distance and detector_distance.*--attr source_distance="),
    (["--attr", "detector_pixel_size=1e-3", "--dims", "view", "v", "u"], None,
     "--dims does not apply to tomo convert"),
    (["--attr", "detector_pixel_size=1e-3", "--dtype", "uint16"], None,
     "--dtype does not apply to tomo convert"),
    (["--attr", "detector_pixel_size=1e-3", "--layout", "volume"], None,
     "makes the projections layout"),
    (["--attr", "detector_pixel_size=-1"], None, "positive"),
])
def test_bad_scans_are_refused_before_anything(scan, tmp_path, capsys, options, edit, message):
    path = tmp_path / "scan.h5"
    path.write_bytes(scan["path"].read_bytes())
    if edit:
        _edit(path, *edit)
    out, runs = tmp_path / "p.zarr", tmp_path / "runs"
    assert _convert(out, runs, path, *options) == 1
    err = capsys.readouterr().err
    assert err.startswith("outcore tomo convert: error: ") and "Fix:" in err
    assert re.search(message, err), err
    assert not out.exists() and not runs.exists()
