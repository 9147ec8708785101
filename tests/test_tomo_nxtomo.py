"""NXtomo scans (one stack told apart by image_key, flats before and after) -> projections.

A 16^3 Shepp-Logan phantom (1/m, 1 mm voxels) is projected over 24 parallel views. The NXtomo
file written here holds, in time order: 3 darks, 4 flats, the first 12 projections, one
invalid frame, the last 12 projections, 4 flats 20 % brighter (the beam drifted) and 2 darks
10 counts higher. Each projection frame is ``dark(t) + (flat(t) - dark(t)) * exp(-p)`` with
flat and dark linear in the frame index t between their groups, so ``--flat-mode linear``
must give back ``p``; ``mean`` and ``nearest`` are checked against numpy twins of their own,
and ``mean`` against the same frames written as a Data Exchange file.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import outcore
from outcore.cli import main
from outcore.tomo import kernels, scan_for, shepp_logan
from outcore.tomo.raw.nxtomo import SelectedFrames, runs, time_weights
from outcore.tomo.raw.source import read_raw

h5py = pytest.importorskip("h5py")

N, VIEWS, VOXEL, MU = 16, 24, 1e-3, 200.0
COMMON = ["--cluster", "threads", "--workers", "1", "--no-progress"]
# image_key of each frame, in time order
KEYS = np.array([2] * 3 + [1] * 4 + [0] * 12 + [3] + [0] * 12 + [1] * 4 + [2] * 2)
PROJ = np.flatnonzero(KEYS == 0)
FLATS = (np.arange(3, 7), np.arange(32, 36))
DARKS = (np.arange(0, 3), np.arange(36, 38))


def _linear(t: np.ndarray, groups: tuple[np.ndarray, np.ndarray], before: np.ndarray,
            after: np.ndarray) -> np.ndarray:
    """The numpy twin of time interpolation: the frame at each index t, linear between the
    two groups' mean frames placed at their mean indices, constant outside them."""
    c0, c1 = groups[0].mean(), groups[1].mean()
    w = np.clip((t - c0) / (c1 - c0), 0.0, 1.0)[:, None, None]
    return (1 - w) * before.mean(0) + w * after.mean(0)


def _write_nxtomo(path: Path, frames: np.ndarray, keys: np.ndarray, degrees: np.ndarray,
                  *, pixel_mm: float | None = 1.0) -> None:
    with h5py.File(path, "w") as f:
        entry = f.create_group("entry0000")
        entry.attrs["NX_class"] = "NXentry"
        entry["definition"] = "NXtomo"
        detector = entry.create_group("instrument/detector")
        detector["data"] = frames
        detector["image_key"] = keys
        if pixel_mm is not None:
            detector["x_pixel_size"] = pixel_mm
            detector["x_pixel_size"].attrs["units"] = "mm"
            detector["y_pixel_size"] = pixel_mm
            detector["y_pixel_size"].attrs["units"] = "mm"
        detector["distance"] = 0.25
        entry["instrument/beam/incident_energy"] = 19.0
        entry["instrument/beam/incident_energy"].attrs["units"] = "keV"
        entry["sample/rotation_angle"] = degrees
        entry["sample/rotation_angle"].attrs["units"] = "degree"
        entry["data/data"] = h5py.SoftLink("/entry0000/instrument/detector/data")


@pytest.fixture(scope="module")
def scan(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("nxtomo")
    volume = (MU * shepp_logan((N, N, N))).compute().astype(np.float32)
    geometry = scan_for("parallel", (N, N, N), VIEWS, voxel_size=VOXEL)
    p = kernels.forward(volume, geometry.angles, geometry).astype(np.float64)
    nv, nu = geometry.detector_shape
    rng = np.random.default_rng(3)
    flat_before = 3000.0 + 400.0 * rng.random((4, nv, nu))
    flat_after = 1.2 * flat_before.mean(0) + 20.0 * rng.random((4, nv, nu))
    dark_before = 90.0 + 10.0 * rng.random((3, nv, nu))
    dark_after = dark_before.mean(0) + 10.0 + rng.random((2, nv, nu))
    flat_t = _linear(PROJ, FLATS, flat_before, flat_after)
    dark_t = _linear(PROJ, DARKS, dark_before, dark_after)
    raw = dark_t + (flat_t - dark_t) * np.exp(-p)
    frames = np.zeros((KEYS.size, nv, nu), np.float32)
    frames[PROJ] = raw
    frames[FLATS[0]], frames[FLATS[1]] = flat_before, flat_after
    frames[DARKS[0]], frames[DARKS[1]] = dark_before, dark_after
    frames[KEYS == 3] = 1e9  # an invalid frame: must never reach a projection or a flat
    degrees = np.zeros(KEYS.size)
    degrees[PROJ] = np.degrees(geometry.angles)
    degrees[KEYS == 3] = 999.0
    path = root / "scan.nxs"
    _write_nxtomo(path, frames, KEYS, degrees)
    stored = frames.astype(np.float64)  # what the file holds (float32 frames)
    return {"path": path, "root": root, "p": p, "geometry": geometry, "frames": stored,
            "volume": volume}


def _minus_log(raw, flat, dark):
    return -np.log((raw - dark) / (flat - dark))


def test_linear_mode_gives_back_the_line_integrals_and_its_twin(scan):
    ds = read_raw(scan["path"], options={"flat_mode": "linear"}, frames_per_chunk=5)
    assert "angles" in ds.coords and ds["angles"].dims == ("view",)
    proj = ds["projections"]
    frames = scan["frames"]
    twin = _minus_log(frames[PROJ], _linear(PROJ, FLATS, frames[FLATS[0]], frames[FLATS[1]]),
                      _linear(PROJ, DARKS, frames[DARKS[0]], frames[DARKS[1]]))
    got = proj.values
    np.testing.assert_allclose(got, twin, rtol=0, atol=3e-6)  # float32 normalisation
    np.testing.assert_allclose(got, scan["p"], rtol=0, atol=3e-5)
    np.testing.assert_allclose(ds["angles"].values, scan["geometry"].angles, rtol=1e-12)
    # the geometry the file records, in metres and keV
    assert ds.attrs["detector_pixel_size"] == pytest.approx(VOXEL, rel=1e-12)
    assert ds.attrs["propagation_distance"] == 0.25 and ds.attrs["energy_kev"] == 19.0
    assert proj.attrs["frames"] == {"projections": 24, "flats": 8, "darks": 5, "invalid": 1}
    assert proj.attrs["flat_mode"] == "linear" and proj.attrs["flat_groups"] == 2


def test_mean_mode_equals_the_data_exchange_layout_of_the_same_frames(scan, tmp_path):
    frames = scan["frames"]
    dx = tmp_path / "scan.h5"
    with h5py.File(dx, "w") as f:
        f["/exchange/data"] = frames[PROJ].astype(np.float32)
        f["/exchange/data_white"] = frames[np.r_[FLATS]].astype(np.float32)
        f["/exchange/data_dark"] = frames[np.r_[DARKS]].astype(np.float32)
        f["/exchange/theta"] = np.degrees(scan["geometry"].angles)
    nx_ds = read_raw(scan["path"], frames_per_chunk=7)
    dx_ds = read_raw(dx, attrs={"detector_pixel_size": "1e-3"})
    twin = _minus_log(frames[PROJ], frames[np.r_[FLATS]].mean(0), frames[np.r_[DARKS]].mean(0))
    np.testing.assert_allclose(nx_ds["projections"].values, dx_ds["projections"].values,
                               rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(nx_ds["projections"].values, twin, rtol=0, atol=3e-6)
    np.testing.assert_allclose(nx_ds["angles"].values, dx_ds["angles"].values, rtol=1e-12)
    # the mean is off the line integrals where the flats drifted (the reason for linear)
    assert np.abs(nx_ds["projections"].values - scan["p"]).max() > 0.05


def test_nearest_mode_takes_the_nearest_group(scan):
    frames = scan["frames"]
    ds = read_raw(scan["path"], options={"flat_mode": "nearest"})
    later = PROJ > (FLATS[0].mean() + FLATS[1].mean()) / 2
    flat = np.where(later[:, None, None], frames[FLATS[1]].mean(0), frames[FLATS[0]].mean(0))
    later = PROJ > (DARKS[0].mean() + DARKS[1].mean()) / 2
    dark = np.where(later[:, None, None], frames[DARKS[1]].mean(0), frames[DARKS[0]].mean(0))
    np.testing.assert_allclose(ds["projections"].values, _minus_log(frames[PROJ], flat, dark),
                               rtol=0, atol=3e-6)


def test_weights_and_runs():
    w = time_weights(np.array([0.0, 5.0, 10.0, 12.5, 20.0]), np.array([2.0, 12.0]), "linear")
    np.testing.assert_allclose(w, [[1, 0], [0.7, 0.3], [0.2, 0.8], [0, 1], [0, 1]])
    w = time_weights(np.array([0.0, 6.0, 8.0]), np.array([2.0, 12.0]), "nearest")
    np.testing.assert_array_equal(w, [[1, 0], [1, 0], [0, 1]])
    assert runs(np.array([3, 4, 5, 9, 10, 14])) == ((3, 6), (9, 11), (14, 15))


def test_blocks_read_only_their_projection_frames(scan, monkeypatch):
    reader = SelectedFrames((PROJ.size, *scan["frames"].shape[1:]), np.dtype(np.float32),
                            str(scan["path"]), "/entry0000/instrument/detector/data", runs(PROJ))
    np.testing.assert_array_equal(reader[10:15], scan["frames"][PROJ[10:15]])  # over the gap
    reads: list[tuple[int, int]] = []
    original = SelectedFrames.read
    monkeypatch.setattr(SelectedFrames, "read",
                        lambda self, a, b: reads.append((a, b)) or original(self, a, b))
    ds = read_raw(scan["path"], options={"flat_mode": "linear"}, frames_per_chunk=8)
    assert reads == []  # making the dataset reads flats and darks only
    np.asarray(ds["projections"].values)  # compute: each block reads its frames
    assert sorted(reads) == [(0, 8), (8, 16), (16, 24)]


def _run(*words: str) -> int:
    return main([*words, *COMMON])


def test_reconstruct_from_the_raw_file_equals_convert_then_reconstruct(scan, tmp_path):
    runs_dir = tmp_path / "runs"
    store = tmp_path / "proj.zarr"
    shape = ["--volume-shape", str(N), str(N), str(N)]
    assert _run("tomo", "convert", str(scan["path"]), str(store), "--flat-mode",
                "linear", "--frames-per-chunk", "8", "--output-dir", str(runs_dir)) == 0
    assert _run("tomo", "reconstruct", "--input", str(store), *shape,
                "--output-dir", str(runs_dir), "--name", "two-steps") == 0
    assert _run("tomo", "reconstruct", "--input", str(scan["path"]), "--flat-mode", "linear",
                *shape, "--output-dir", str(runs_dir), "--name", "one-step") == 0
    two = outcore.open(runs_dir / "two-steps" / "volume.zarr", layout="volume")["volume"]
    one = outcore.open(runs_dir / "one-step" / "volume.zarr", layout="volume")["volume"]
    np.testing.assert_allclose(one.values, two.values, rtol=0,
                               atol=1e-5 * float(np.abs(two.values).max()))
    truth = scan["volume"]  # and it is the phantom: 22.7 dB PSNR, mean within 0.04 %
    psnr = 10 * np.log10(truth.max() ** 2 / np.mean((one.values - truth) ** 2))
    assert psnr > 20.0 and abs(one.values.mean() / truth.mean() - 1) < 0.01, psnr
    summary = outcore.runs.load_summary(runs_dir / "one-step")
    assert summary["config"]["beamline"] == {"flat_mode": "linear"}
    assert summary["plan"]["stages"][0]["name"] == "read-and-normalise"


def _refused(capsys, *words: str) -> str:
    assert _run(*words) == 1
    err = capsys.readouterr().err
    assert "error: " in err and "Fix:" in err
    return err


@pytest.mark.parametrize(("keys", "message"), [
    (np.where(KEYS == 3, 5, KEYS), r"holds \[5\] at 1 frames"),
    (np.where(KEYS == 0, 1, KEYS), "marks no frame as a projection"),
    (np.where(KEYS == 1, 0, KEYS), "marks no frame as a flat"),
    (np.where(KEYS == 2, 0, KEYS), "marks no frame as a dark.*--darks none"),
])
def test_bad_image_keys_are_refused_before_compute(scan, tmp_path, capsys, monkeypatch, keys,
                                                   message):
    reads: list[tuple[int, int]] = []
    monkeypatch.setattr(SelectedFrames, "read", lambda self, a, b: reads.append((a, b)))
    path = tmp_path / "bad.nxs"
    _write_nxtomo(path, scan["frames"].astype(np.float32), keys, np.zeros(KEYS.size))
    out, runs_dir = tmp_path / "p.zarr", tmp_path / "runs"
    for verb in (["tomo", "convert", str(path), str(out)],
                 ["tomo", "reconstruct", "--input", str(path)]):
        err = _refused(capsys, *verb, "--output-dir", str(runs_dir))
        assert re.search(message, err), err
    assert not out.exists() and not runs_dir.exists() and reads == []


def test_options_that_do_not_apply_are_refused(scan, tmp_path, capsys):
    runs_dir = ["--output-dir", str(tmp_path / "runs")]
    err = _refused(capsys, "tomo", "convert", str(scan["path"]), str(tmp_path / "a.zarr"),
                   "--flats", "/entry0000/flats", *runs_dir)
    assert "NXtomo: its flats and darks are the frames with image_key" in err
    err = _refused(capsys, "tomo", "reconstruct", "--input", str(scan["path"]),
                   "--attr", "detector_pixel_size=-1", *runs_dir)
    assert "positive" in err
    no_pixel = tmp_path / "nopixel.nxs"
    _write_nxtomo(no_pixel, scan["frames"].astype(np.float32), KEYS, np.zeros(KEYS.size),
                  pixel_mm=None)
    err = _refused(capsys, "tomo", "convert", str(no_pixel), str(tmp_path / "b.zarr"),
                   "--attr", "geometry=cone", "--attr", "source_distance=1", *runs_dir)
    assert "detector pixel size" in err
    dx = tmp_path / "dx.h5"
    with h5py.File(dx, "w") as f:
        f["/exchange/data"] = scan["frames"][PROJ].astype(np.float32)
        f["/exchange/data_white"] = scan["frames"][FLATS[0]].astype(np.float32)
        f["/exchange/data_dark"] = scan["frames"][DARKS[0]].astype(np.float32)
        f["/exchange/theta"] = np.zeros(PROJ.size)
    err = _refused(capsys, "tomo", "convert", str(dx), str(tmp_path / "c.zarr"),
                   "--attr", "detector_pixel_size=1e-3", "--flat-mode", "linear", *runs_dir)
    assert "needs the time of each flat" in err
    store = tmp_path / "store.zarr"
    ds = read_raw(scan["path"])
    outcore.save(ds, store)
    for flag, value in (("--flat-mode", "linear"), ("--attr", "detector_pixel_size=1"),
                        ("--dataset", "/entry/data")):
        err = _refused(capsys, "tomo", "reconstruct", "--input", str(store), flag, value,
                       *runs_dir)
        assert f"{flag} applies to raw beamline scans only" in err
    assert not (tmp_path / "runs").exists()


def test_frames_behind_an_external_link_with_keys_in_the_master_file(scan, tmp_path, capsys,
                                                                    monkeypatch):
    """A DIAD-like master file: the frames an external link into the detector's own file in
    a folder beside it, the keys in the master file beside the link (not beside the link's
    target), the angles an external link into another file, and a third link whose file is
    not there. The link resolves from the master's folder whatever the working folder, the
    dangling one is ignored, and a dangling link asked for is named in one line."""
    frames, degrees = scan["frames"].astype(np.float32), np.linspace(0, 180, KEYS.size)
    (tmp_path / "scan").mkdir()
    with h5py.File(tmp_path / "scan" / "scan-imaging.h5", "w") as f:
        f["/entry/detector/detector"] = frames
    with h5py.File(tmp_path / "scan" / "scan-panda.h5", "w") as f:
        f["/entry/theta/value"] = degrees
    with h5py.File(tmp_path / "scan.nxs", "w") as f:
        f["/entry/instrument/imaging/data"] = h5py.ExternalLink(
            "scan/scan-imaging.h5", "/entry/detector/detector")
        f["/entry/instrument/imaging/image_key"] = KEYS
        f["/entry/imaging/data"] = h5py.ExternalLink("scan/scan-imaging.h5",
                                                     "/entry/detector/detector")
        f["/entry/imaging/theta"] = h5py.ExternalLink("scan/scan-panda.h5",
                                                      "/entry/theta/value")
        f["/entry/imaging/theta_set"] = h5py.ExternalLink("scan/missing.h5", "/entry/set")
    runs = ["--output-dir", str(tmp_path / "runs"), "--cluster", "threads", "--no-progress"]
    beside = ["--angles", "/entry/imaging/theta", "--attr", f"detector_pixel_size={VOXEL}",
              "--flat-mode", "linear"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the links resolve from the master file's folder
    for name, args in (("beside", ["--dataset", "/entry/instrument/imaging/data"]),
                       ("named", ["--dataset", "/entry/imaging/data", "--image-key",
                                  "/entry/instrument/imaging/image_key"])):
        out = tmp_path / f"{name}.zarr"
        assert main(["tomo", "convert", str(tmp_path / "scan.nxs"), str(out), *args, *beside,
                     "--name", name, *runs]) == 0
        ds = outcore.open(out)
        np.testing.assert_allclose(np.degrees(ds["angles"].values), degrees[PROJ])
        np.testing.assert_allclose(ds["projections"].values, scan["p"], rtol=1e-3, atol=1e-3)
    capsys.readouterr()
    assert main(["tomo", "convert", str(tmp_path / "scan.nxs"), str(tmp_path / "x.zarr"),
                 "--dataset", "/entry/instrument/imaging/data", "--angles",
                 "/entry/imaging/theta_set", *runs]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'/entry/imaging/theta_set' is an external link to" in err[0]
    assert "'scan/missing.h5', which cannot be opened" in err[0]
