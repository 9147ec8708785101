"""Raw scans written as TIFF files (one per projection, flats and darks beside them, the
angles in a text file): read as the projections layout like an HDF5 scan."""

from __future__ import annotations

import numpy as np
import pytest

import outcore
from outcore.cli import main
from outcore.runs import load_summary
from outcore.tomo.raw.beamline import read_beamline_hdf5

h5py = pytest.importorskip("h5py")
tifffile = pytest.importorskip("tifffile")

VIEWS, NV, NU = 180, 3, 64
CENTRE = 33.3
COMMON = ["--cluster", "threads", "--no-progress"]


def _line_integrals() -> np.ndarray:
    """Three identical rows of an analytic sinogram of two discs, the axis at ``CENTRE``,
    over 0..179 degrees: ``(view, v, u)``."""
    angles = np.radians(np.arange(VIEWS))
    u = np.arange(NU)[None, :] - CENTRE
    sinogram = np.zeros((VIEWS, NU))
    for x, y, r, mu in ((0.0, 0.0, 12.0, 0.02), (9.0, -5.0, 4.0, 0.05)):
        u0 = (x * np.cos(angles) + y * np.sin(angles))[:, None]
        sinogram += 2 * mu * np.sqrt(np.clip(r * r - (u - u0) ** 2, 0, None))
    return np.repeat(sinogram[:, None, :], NV, axis=1)


@pytest.fixture(scope="module")
def scan(tmp_path_factory) -> dict:
    """The scan as a beamline writes it: ``proj_{i}.tif`` unpadded (a glob lists proj_10
    before proj_2), five single-frame flats, three darks in one multi-page TIFF, the angles
    in degrees in ``angles.txt``; and the same frames as a Data Exchange file."""
    root = tmp_path_factory.mktemp("tiffscan")
    p = _line_integrals()
    rng = np.random.default_rng(5)
    flats = 3000.0 + 300.0 * rng.random((5, NV, NU))
    darks = 100.0 + 10.0 * rng.random((3, NV, NU))
    raw = (darks.mean(0) + (flats.mean(0) - darks.mean(0)) * np.exp(-p)).astype(np.float32)
    for i, frame in enumerate(raw):
        tifffile.imwrite(root / f"proj_{i}.tif", frame)
    for i, frame in enumerate(flats.astype(np.float32)):
        tifffile.imwrite(root / f"flat_{i}.tif", frame)
    for frame in darks.astype(np.float32):  # one page each
        tifffile.imwrite(root / "dark.tif", frame, append=True)
    np.savetxt(root / "angles.txt", np.arange(VIEWS, dtype=np.float64))
    with h5py.File(root / "scan.h5", "w") as f:
        f["/exchange/data"] = raw
        f["/exchange/data_white"] = flats.astype(np.float32)
        f["/exchange/data_dark"] = darks.astype(np.float32)
        f["/exchange/theta"] = np.arange(VIEWS, dtype=np.float64)
    return {"root": root, "p": p}


def _options(root) -> list[str]:
    return [str(root / "proj_*.tif"), "--flats", str(root / "flat_*.tif"), "--darks",
            str(root / "dark.tif"), "--angles", str(root / "angles.txt")]


def test_a_tiff_scan_converts_like_its_hdf5_twin(scan, tmp_path):
    """The projections equal -log((raw - dark) / (flat - dark)) (the line integrals the
    frames were made from) in the order of the names, and the HDF5 path's to float32."""
    root, out = scan["root"], tmp_path / "p.zarr"
    source, *options = _options(root)
    assert main(["tomo", "convert", source, str(out), *options, "--frames-per-chunk", "16",
                 "--output-dir", str(tmp_path / "runs"), *COMMON]) == 0
    ds = outcore.open(out)
    got = ds["projections"].values
    np.testing.assert_allclose(got, scan["p"], rtol=0, atol=2e-5)
    np.testing.assert_allclose(ds["angles"].values, np.radians(np.arange(VIEWS)))
    assert ds.attrs["length_unit"] == "pixel"
    twin = read_beamline_hdf5(root / "scan.h5")["projections"].values
    np.testing.assert_allclose(got, twin, rtol=0, atol=1e-6)


def test_tomo_center_and_reconstruct_read_the_tiff_frames(scan, tmp_path):
    root = scan["root"]
    source, *options = _options(root)
    runs = ["--output-dir", str(tmp_path / "runs"), *COMMON]
    assert main(["tomo", "center", "--input", source, *options, "--name", "c", *runs]) == 0
    assert load_summary(tmp_path / "runs" / "c")["metrics"]["center"] == pytest.approx(
        CENTRE, abs=0.1)
    assert main(["tomo", "reconstruct", "--input", source, *options, "--center", "auto",
                 "--method", "fbp", "--name", "r", *runs]) == 0
    summary = load_summary(tmp_path / "runs" / "r")
    assert summary["metrics"]["center"] == pytest.approx(CENTRE, abs=0.1)
    volume = outcore.open(tmp_path / "runs" / "r" / "volume.zarr")["volume"].values
    # the large disc's attenuation per pixel at the middle of the slice
    assert volume[1, NU // 2 - 2:NU // 2 + 2, NU // 2 - 2:NU // 2 + 2].mean() == pytest.approx(
        0.02, rel=0.1)


@pytest.mark.parametrize(("change", "words"), [
    ({"--flats": None}, "A TIFF scan's flats are files of their own"),
    ({"--darks": None}, "--darks the dark frames (a file, a folder or a glob), or --darks none"),
    ({"--angles": None}, "A TIFF scan's angles are a file of their own; none given"),
    ({"--angles": "/exchange/theta"}, "'/exchange/theta' is not one"),
    ({"--angles": "short.txt"}, "holds 5 angles but"),
    ({"--flats": "small.tif"}, "The flats 'SMALL' are 3 x 10 frames, the projections 3 x 64"),
    ({"--dataset": "/exchange/data"}, "--dataset applies to NXtomo and Data Exchange scans"),
])
def test_what_a_tiff_scan_lacks_is_named_before_anything_starts(scan, tmp_path, capsys,
                                                                 change, words):
    root = scan["root"]
    np.savetxt(tmp_path / "short.txt", np.arange(5.0))
    tifffile.imwrite(tmp_path / "small.tif", np.ones((NV, 10), np.float32))
    source, *options = _options(root)
    given = dict(zip(options[::2], options[1::2], strict=True))
    for flag, value in change.items():
        if value is None:
            given.pop(flag)
        else:
            given[flag] = str(tmp_path / value) if value.endswith((".txt", ".tif")) else value
    argv = [x for pair in given.items() for x in pair]
    assert main(["tomo", "convert", source, str(tmp_path / "o.zarr"), *argv, "--output-dir",
                 str(tmp_path / "runs"), *COMMON]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words.replace("SMALL", str(tmp_path / "small.tif")) in err[0], err
    assert not (tmp_path / "runs").exists()
