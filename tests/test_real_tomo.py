"""Tomography on scans nobody here simulated (../shared/real, its README gives the
references): the APS tooth (Data Exchange), read as a user runs it."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from outcore.cli import main
from outcore.runs import load_summary

pytestmark = pytest.mark.realdata
COMMON = ["--cluster", "threads", "--no-progress"]
#: The tooth's rotation axis: projection 0 against the mirror of projection 180 (README).
TOOTH_CENTRE = 295.5


def test_the_tooth_s_axis_with_its_angles_from_a_text_file(real_data, tmp_path, capsys):
    """The stored theta steps by 180/181 degrees, the projections by 1 degree (README): a
    text file of the right angles, given by --angles, puts the axis within 0.2 px of the
    mirror's column (the stored angles move it by a third of a pixel)."""
    np.savetxt(tmp_path / "angles.txt", np.arange(181.0))
    tooth = real_data / "tomo" / "aps_tooth" / "tooth.h5"
    runs = ["--output-dir", str(tmp_path / "runs")]
    assert main(["tomo", "convert", str(tooth), str(tmp_path / "t.zarr"), "--angles",
                 str(tmp_path / "angles.txt"), "--attr", "detector_pixel_size=1", *COMMON,
                 *runs]) == 0
    assert main(["tomo", "center", "--input", str(tmp_path / "t.zarr"), "--name", "c",
                 *COMMON, *runs]) == 0
    centre = load_summary(tmp_path / "runs" / "c")["metrics"]["center"]
    assert abs(centre - TOOTH_CENTRE) < 0.2, centre
    assert "warning:" not in capsys.readouterr().out  # the mirror agrees with these angles


def test_tomo_center_reads_the_raw_scan_itself(real_data, tmp_path, capsys):
    """``tomo center --input tooth.h5``: the raw frames normalised on the way in, with no
    store written first and no option (the file gives no pixel size, and the centre needs
    none); the stored angles (180/181-degree steps) put the axis at 295.84, and a warning
    says that the projections disagree with them."""
    tooth = real_data / "tomo" / "aps_tooth" / "tooth.h5"
    assert main(["tomo", "center", "--input", str(tooth), "--name", "c", "--output-dir",
                 str(tmp_path / "runs"), *COMMON]) == 0
    summary = load_summary(tmp_path / "runs" / "c")
    assert abs(summary["metrics"]["center"] - TOOTH_CENTRE) < 0.5
    assert [i["path"] for i in summary["inputs"]] == [str(tooth)]
    # the stored angles put the mirror of view 0 a view past the last, the projections at
    # view 180: the warning names the step they imply and the option that sets the angles
    warning = [line for line in capsys.readouterr().out.splitlines()
               if line.startswith("warning:")]
    assert len(warning) == 1 and "the projections at view 179.9" in warning[0], warning
    assert "1.000" in warning[0] and "the file says 0.9945" in warning[0]
    assert "--angles FILE" in warning[0]


def _fbp(sinogram: np.ndarray, theta: np.ndarray, centre: float, n: int) -> np.ndarray:
    """Filtered back-projection written here, apart from outcore's: a ramp filter by FFT
    (zero-padded to a power of two), then each filtered view spread along its lines by
    numpy's linear interpolation onto an ``n x n`` grid centred on the axis ``centre``."""
    views, nu = sinogram.shape
    pad = 2 ** int(np.ceil(np.log2(2 * nu)))
    ramp = 2 * np.fft.rfftfreq(pad)
    filtered = np.fft.irfft(np.fft.rfft(sinogram, pad, axis=1) * ramp, pad, axis=1)[:, :nu]
    axis = np.arange(n) - (n - 1) / 2
    x, y = np.meshgrid(axis, axis, indexing="xy")
    out = np.zeros((n, n))
    for line, angle in zip(filtered, theta, strict=True):
        out += np.interp(x * np.cos(angle) + y * np.sin(angle) + centre, np.arange(nu), line,
                         left=0, right=0)
    return out * np.pi / views


def test_the_tooth_reconstructed_from_its_raw_file_matches_an_independent_fbp(
        real_data, tmp_path, capsys):
    """``tomo reconstruct --input tooth.h5 --center auto``, as a user types it (the file has
    no pixel size: the volume is in pixels, and says so): the axis within 0.5 px of 295.5, and
    each slice correlated >= 0.97 with an FBP of the same raw frames written in this test
    (-log((raw - dark) / (flat - dark)) with the mean flat and dark, the stored angles, the
    centre the run found)."""
    h5py = pytest.importorskip("h5py")
    tooth = real_data / "tomo" / "aps_tooth" / "tooth.h5"
    assert main(["tomo", "reconstruct", "--input", str(tooth), "--center", "auto", "--method",
                 "fbp", "--name", "r", "--output-dir", str(tmp_path / "runs"), *COMMON]) == 0
    assert capsys.readouterr().out.count("gives no pixel size") == 1  # said once
    run = tmp_path / "runs" / "r"
    centre = load_summary(run)["metrics"]["center"]
    assert abs(centre - TOOTH_CENTRE) < 0.5, centre
    with h5py.File(tooth, "r") as f:
        raw = f["/exchange/data"][()].astype(np.float64)
        flat = f["/exchange/data_white"][()].mean(axis=0)
        dark = f["/exchange/data_dark"][()].mean(axis=0)
        theta = np.deg2rad(f["/exchange/theta"][()])
    line_integrals = -np.log(np.clip((raw - dark) / (flat - dark), 1e-6, None))
    stored = xr.open_zarr(run / "volume.zarr", consolidated=False)
    assert stored.attrs["length_unit"] == "pixel" and stored.attrs["voxel_size"] == 1.0
    volume = stored["volume"].values
    for row in range(volume.shape[0]):
        ours = volume[row]
        theirs = _fbp(line_integrals[:, row], theta, centre, ours.shape[0])
        assert np.corrcoef(ours.ravel(), theirs.ravel())[0, 1] >= 0.97


def test_the_diad_nxtomo_file_with_its_external_links(real_data, tmp_path):
    """Diamond DIAD: the frames an external link into the detector's file, the keys in the
    master file, the encoder's angles an external link into another file, two links that
    dangle. Its projections equal -log((raw - dark) / (flat - dark)) written here from the
    detector's own file (the mean of the flats before and after, and of the darks) to 1e-3,
    at the encoder's angles."""
    h5py = pytest.importorskip("h5py")
    folder = real_data / "tomo" / "diamond_diad_k11_18014"
    out = tmp_path / "diad.zarr"
    assert main(["tomo", "convert", str(folder / "k11-18014.nxs"), str(out), "--dataset",
                 "/entry/imaging/data", "--image-key", "/entry/instrument/imaging/image_key",
                 "--angles", "/entry/imaging_sum/gts_theta_value", "--output-dir",
                 str(tmp_path / "runs"), *COMMON]) == 0
    with h5py.File(folder / "k11-18014.nxs", "r") as f:
        keys = f["/entry/instrument/imaging/image_key"][()]
    with h5py.File(folder / "k11-18014" / "k11-18014-imaging.h5", "r") as f:
        raw = f["/entry/detector/detector"][()].astype(np.float64)
    with h5py.File(folder / "k11-18014" / "k11-18014-pcompPanda.h5", "r") as f:
        degrees = f["/entry/gts_theta.value/gts_theta.value"][()]
    flat, dark = raw[keys == 1].mean(axis=0), raw[keys == 2].mean(axis=0)
    expected = -np.log((raw[keys == 0] - dark) / (flat - dark))
    stored = xr.open_zarr(out, consolidated=False)
    assert stored["projections"].shape == (3001, 22, 26)
    np.testing.assert_allclose(stored["projections"].values, expected, rtol=0, atol=1e-3)
    np.testing.assert_allclose(np.degrees(stored["angles"].values), degrees[keys == 0])
    assert np.degrees(stored["angles"].values[[0, -1]]).round(2).tolist() == [90.0, 269.99]


def test_the_tooth_as_a_tiff_scan_gives_the_hdf5_path_s_answers(real_data, tmp_path):
    """The tooth's measured frames written as a beamline's TIFF scan (one file per
    projection, named so that a glob lists them out of order, the 10 flats as files, the
    darks averaged into one frame, 1-degree angles in a text file): the centre within 0.5
    px of 295.5, and the same centre and volume as the HDF5 file read with those angles."""
    import h5py
    import tifffile

    tooth = real_data / "tomo" / "aps_tooth" / "tooth.h5"
    scan = tmp_path / "scan"
    scan.mkdir()
    with h5py.File(tooth, "r") as f:
        data, flats = f["/exchange/data"][...], f["/exchange/data_white"][...]
        dark = f["/exchange/data_dark"][...].mean(axis=0).astype(np.float32)
    for i, frame in enumerate(data):
        tifffile.imwrite(scan / f"tooth_{i}.tif", frame)
    for i, frame in enumerate(flats):
        tifffile.imwrite(scan / f"flat_{i}.tif", frame)
    tifffile.imwrite(scan / "dark.tif", dark)
    np.savetxt(scan / "angles.txt", np.arange(181.0))
    runs = ["--output-dir", str(tmp_path / "runs"), *COMMON]
    tiffs = [str(scan / "tooth_*.tif"), "--flats", str(scan / "flat_*.tif"), "--darks",
             str(scan / "dark.tif"), "--angles", str(scan / "angles.txt")]
    hdf5 = [str(tooth), "--angles", str(scan / "angles.txt")]
    for name, source in (("tiff", tiffs), ("hdf5", hdf5)):
        assert main(["tomo", "reconstruct", "--input", *source, "--center", "auto",
                     "--name", name, *runs]) == 0
    centres = [load_summary(tmp_path / "runs" / n)["metrics"]["center"] for n in ("tiff", "hdf5")]
    assert abs(centres[0] - TOOTH_CENTRE) < 0.5
    assert centres[0] == pytest.approx(centres[1], abs=0.01)
    volumes = [xr.open_zarr(tmp_path / "runs" / n / "volume.zarr", consolidated=False)
               ["volume"].values for n in ("tiff", "hdf5")]
    scale = np.abs(volumes[1]).max()
    np.testing.assert_allclose(volumes[0], volumes[1], atol=1e-3 * scale)
