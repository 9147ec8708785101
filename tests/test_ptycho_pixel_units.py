"""A scan measured in pixels (``length_unit: pixel``, no energy, wavelength or detector
geometry): it preprocesses and reconstructs as its twin in metres does, says so once, and
refuses lengths in both units."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import outcore
from outcore.cli import main
from outcore.errors import LayoutError
from outcore.io.store import write_new
from outcore.ptycho.preprocessing.pipeline import preprocess

from .ptycho_cases import local_client

COMMON = ["--cluster", "threads", "--no-progress"]
METRES_ONLY = ("energy", "wavelength", "reciprocal_pixel_size")


@pytest.fixture(scope="module")
def client():
    """The default client that ``preprocess`` runs on."""
    with local_client() as client:
        yield client


def in_pixels(stack: xr.Dataset) -> xr.Dataset:
    """The simulated ``stack`` as a user would repack it without its physics: positions
    (and the scan step) over the object pixel ``1 / (K * reciprocal_pixel_size)``, the
    defocus as ``wavelength * defocus / pixel^2`` (a wavelength of one pixel), no energy
    and no reciprocal pixel, ``length_unit: pixel``."""
    k = stack.sizes["k_y"]
    pixel = 1.0 / (k * stack.attrs["reciprocal_pixel_size"])
    wavelength = 1.239841984e-6 / stack.attrs["energy"]
    attrs = {key: value for key, value in stack.attrs.items() if key not in METRES_ONLY}
    attrs.update(length_unit="pixel", scan_step=stack.attrs["scan_step"] / pixel,
                 defocus=wavelength * stack.attrs["defocus"] / pixel**2)
    out = stack.assign(positions=stack["positions"] / pixel)
    out.attrs = attrs
    return out


@pytest.fixture(scope="module")
def twins(tmp_path_factory) -> Path:
    """A simulated 8 x 8 scan with sub-pixel jitter in metres, and its twin in pixels."""
    root = tmp_path_factory.mktemp("ptycho-pixels")
    assert main(["ptycho", "simulate", "--output", str(root / "m.zarr"), "--scan", "8", "8",
                 "--detector", "32", "--step", "5", "--jitter", "1.5", "--subpixel",
                 "--name", "sim", "--output-dir", str(root / "runs"), *COMMON]) == 0
    stack = outcore.open(root / "m.zarr")
    write_new(in_pixels(stack), root / "px.zarr")
    return root


def test_a_scan_in_pixels_reconstructs_as_its_twin_in_metres(twins, capsys):
    """The same scan given in metres with its energy and detector, and in pixels without:
    the same windows, probe guess and amplitudes, and after 10 iterations the same object,
    probe and losses to float32 rounding; the pixel run says so once and writes pixels."""
    runs = ["--output-dir", str(twins / "runs"), *COMMON]
    for name in ("m", "px"):
        assert main(["ptycho", "preprocess", "--input", str(twins / f"{name}.zarr"),
                     "--output", str(twins / f"pre-{name}.zarr"), "--name", f"pre-{name}",
                     *runs]) == 0
        out = capsys.readouterr().out
        assert out.count("lengths are in pixels") == (name == "px")
        assert main(["ptycho", "reconstruct", "--input", str(twins / f"pre-{name}.zarr"),
                     "--iterations", "10", "--batch-size", "16", "--name", f"rec-{name}",
                     *runs]) == 0
        assert "lengths are in pixels" not in capsys.readouterr().out
    pre = {name: xr.open_zarr(twins / f"pre-{name}.zarr", consolidated=False).load()
           for name in ("m", "px")}
    assert pre["px"].attrs["pixel_size"] == 1.0 and pre["px"].attrs["length_unit"] == "pixel"
    assert "length_unit" not in pre["m"].attrs
    np.testing.assert_array_equal(pre["px"]["top_left"], pre["m"]["top_left"])
    np.testing.assert_allclose(pre["px"]["positions"],
                               pre["m"]["positions"] / pre["m"].attrs["pixel_size"], atol=1e-9)
    np.testing.assert_array_equal(pre["px"]["amplitudes"], pre["m"]["amplitudes"])
    np.testing.assert_allclose(pre["px"]["probe_guess"], pre["m"]["probe_guess"], atol=1e-6)
    rec = {name: xr.open_zarr(twins / "runs" / f"rec-{name}" / "reconstruction.zarr",
                              consolidated=False).load() for name in ("m", "px")}
    for variable in ("object", "probe"):
        scale = float(np.abs(rec["m"][variable]).max())
        np.testing.assert_allclose(rec["px"][variable], rec["m"][variable], atol=1e-4 * scale)
    np.testing.assert_allclose(rec["px"]["loss"], rec["m"]["loss"], rtol=1e-4)
    assert rec["px"].attrs["length_unit"] == "pixel" and rec["px"]["x"].attrs["units"] == "pixel"
    np.testing.assert_array_equal(rec["px"]["x"], np.arange(rec["px"].sizes["x"]))


def test_a_grid_scan_in_pixels_needs_only_its_step_in_pixels(client):
    """A 4-D grid stack with ``scan_step`` in pixels and nothing physical preprocesses:
    windows ``step`` pixels apart and an object pixel of 1."""
    data = np.ones((3, 4, 16, 16), np.float32)
    ds = xr.Dataset({"data": (("scan_y", "scan_x", "k_y", "k_x"), data)},
                    attrs={"length_unit": "pixel", "scan_step": [3.0, 2.0]})
    pre = preprocess(ds)
    assert pre.attrs["pixel_size"] == 1.0 and pre.attrs["reciprocal_pixel_size"] == 1 / 16
    corners = pre["top_left"].values
    assert sorted(set(np.diff(corners[:, 1]).tolist())) == [-6, 2]  # rows of 4, 2 px apart
    assert set(corners[:, 0].tolist()) == {0, 3, 6}


@pytest.mark.parametrize("change, message", [
    ({"energy": 8000.0}, "cannot be mixed"),
    ({"positions_scale": 1e-9}, "look like metres"),
    ({"length_unit": None}, "length_unit"),
])
def test_lengths_in_pixels_and_metres_are_refused(twins, change, message, client):
    ds = outcore.open(twins / "px.zarr")
    if "positions_scale" in change:
        ds = ds.assign(positions=ds["positions"] * change["positions_scale"])
    elif change.get("length_unit", 1) is None:
        ds = ds.copy()
        del ds.attrs["length_unit"]
    else:
        ds = ds.assign_attrs(change)
    with pytest.raises(LayoutError, match=message):
        preprocess(ds)


def test_a_probe_and_a_mask_from_files_on_the_command_line(twins, tmp_path):
    """A user's own probe guess and detector mask (.npy) with a scan in pixels: the store's
    probe guess is the file's, its mask the file's, and the summary counts the masked
    pixels."""
    from outcore.runs import load_summary

    truth = xr.open_zarr(twins / "m.truth.zarr", consolidated=False)
    probe = truth["probe"].values.astype(np.complex64)
    mask = np.zeros((32, 32), bool)
    mask[3, 5] = mask[20, 7] = True
    mask[14:18, 0:2] = True
    np.save(tmp_path / "probe.npy", probe)
    np.save(tmp_path / "mask.npy", mask)
    assert main(["ptycho", "preprocess", "--input", str(twins / "px.zarr"), "--output",
                 str(tmp_path / "pre.zarr"), "--probe", str(tmp_path / "probe.npy"), "--mask",
                 str(tmp_path / "mask.npy"), "--centre", "16", "16", "--name", "given",
                 "--output-dir", str(tmp_path / "runs"), *COMMON]) == 0
    pre = xr.open_zarr(tmp_path / "pre.zarr", consolidated=False)
    np.testing.assert_array_equal(pre["probe_guess"].values, probe)
    np.testing.assert_array_equal(pre["mask"].values, mask)
    assert pre.attrs["preprocess"]["probe"] == str(tmp_path / "probe.npy")
    assert load_summary(tmp_path / "runs" / "given")["metrics"]["masked_pixels"] == 10


def test_the_frc_of_a_scan_in_pixels_is_in_pixels(twins, tmp_path):
    """``ptycho frc`` on a scan in pixels: the crossing and resolution in pixels only, and a
    frc.csv without a frequency per metre."""
    from outcore.runs import load_summary

    runs = ["--output-dir", str(tmp_path / "runs"), *COMMON]
    assert main(["ptycho", "preprocess", "--input", str(twins / "px.zarr"), "--output",
                 str(tmp_path / "pre.zarr"), "--name", "pre", *runs]) == 0
    assert main(["ptycho", "frc", "--input", str(tmp_path / "pre.zarr"), "--iterations", "10",
                 "--batch-size", "16", "--name", "frc", *runs]) == 0
    metrics = load_summary(tmp_path / "runs" / "frc")["metrics"]
    assert metrics["frc_crossing_per_px"] is None or 0 < metrics["frc_crossing_per_px"] <= 0.5
    assert "frc_crossing_per_m" not in metrics and "frc_resolution_px" in metrics
    header = (tmp_path / "runs" / "frc" / "frc.csv").read_text().splitlines()[0]
    assert header == "frequency_per_px,frc,half_bit,ring_pixels"
