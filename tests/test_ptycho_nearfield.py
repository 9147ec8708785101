"""Near-field ptychography: CXI files read into ``diffraction`` stores (their fields, units
and position convention, and a field they lack named in one line), the angular-spectrum
propagator against a Gaussian beam's analytic width and as a unitary operator, the
near-field model's gradients against finite differences, a simulated near-field scan
reconstructed to its known object, and the PETRA III P25 scan."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from outcore import io
from outcore.cli import main
from outcore.io.importers.cxi import EV_J

COMMON = ["--cluster", "threads", "--no-progress"]


def _cxi(path: Path, frames: int = 6, k: int = 8, *, drop: str | None = None,
         basis: np.ndarray | None = None) -> dict:
    """A small CXI file as cdtools writes them, without the field ``drop``; its contents."""
    rng = np.random.default_rng(0)
    fields = {
        "entry_1/instrument_1/detector_1/data": rng.integers(0, 100, (frames, k, k), np.int32),
        "entry_1/instrument_1/detector_1/mask": (rng.random((k, k)) > 0.9).astype(np.uint32),
        "entry_1/instrument_1/detector_1/distance": np.float32(1.12),
        "entry_1/instrument_1/detector_1/x_pixel_size": np.float32(55e-6),
        "entry_1/instrument_1/detector_1/y_pixel_size": np.float32(55e-6),
        "entry_1/instrument_1/detector_1/basis_vectors": np.array(
            [[0, -55e-6], [-55e-6, 0], [0, 0]], np.float32) if basis is None else basis,
        "entry_1/instrument_1/source_1/energy": np.float32(2.028e-15),
        "entry_1/sample_1/geometry_1/translation": np.column_stack(
            [rng.normal(0, 1e-6, (frames, 2)), np.zeros(frames)]).astype(np.float32),
    }
    with h5py.File(path, "w") as f:
        for name, value in fields.items():
            if name != drop:
                f[name] = value
    return fields


def test_cxi_converts_to_a_diffraction_store_with_its_fields(tmp_path):
    fields = _cxi(tmp_path / "scan.cxi")
    code = main(["convert", str(tmp_path / "scan.cxi"), str(tmp_path / "scan.zarr"),
                 "--attr", "focus_sample_distance=3.65e-3", "--output-dir",
                 str(tmp_path / "runs"), *COMMON])
    assert code == 0
    ds = io.open(tmp_path / "scan.zarr", layout="diffraction")
    detector = "entry_1/instrument_1/detector_1/"
    np.testing.assert_array_equal(ds["data"].values, fields[detector + "data"])
    assert ds["data"].dtype == np.uint32  # counts, so preprocessing picks the Poisson loss
    np.testing.assert_array_equal(ds["mask"].values, fields[detector + "mask"] != 0)
    translation = fields["entry_1/sample_1/geometry_1/translation"].astype(np.float64)
    # rows along -y and columns along -x: the probe, at minus the translation, is at +x, +y
    np.testing.assert_array_equal(ds["positions"].values, translation[:, :2])
    assert ds.attrs["energy"] == pytest.approx(2.028e-15 / EV_J, rel=1e-6)
    assert ds.attrs["energy"] == pytest.approx(12658, rel=1e-4)
    assert ds.attrs["detector_distance"] == 1.12
    assert ds.attrs["detector_pixel_size"] == [55e-6, 55e-6]
    assert ds.attrs["focus_sample_distance"] == 3.65e-3


def test_cxi_positions_follow_the_detector_basis(tmp_path):
    """A detector whose rows run along +x and columns along +y (basis as (2, 3) rows): the
    positions are minus the translation on those axes, (-t_y, -t_x) as (x, y)."""
    basis = np.array([[55e-6, 0, 0], [0, 55e-6, 0]], np.float32)
    fields = _cxi(tmp_path / "turned.cxi", basis=basis)
    ds, layout = io.read_source(tmp_path / "turned.cxi")
    translation = fields["entry_1/sample_1/geometry_1/translation"].astype(np.float64)
    assert layout == "diffraction"
    np.testing.assert_allclose(ds["positions"].values, -translation[:, [1, 0]])


@pytest.mark.parametrize(("drop", "named", "option"), [
    ("entry_1/instrument_1/detector_1/distance", "detector_1/distance",
     "--attr detector_distance="),
    ("entry_1/instrument_1/source_1/energy", "source_1/energy", "--attr energy="),
    ("entry_1/instrument_1/detector_1/x_pixel_size", "x_pixel_size",
     "--attr detector_pixel_size="),
    ("entry_1/sample_1/geometry_1/translation", "translation", "--array positions="),
])
def test_a_cxi_field_missing_is_named_with_the_option_that_gives_it(tmp_path, capsys, drop,
                                                                    named, option):
    _cxi(tmp_path / "scan.cxi", drop=drop)
    code = main(["convert", str(tmp_path / "scan.cxi"), str(tmp_path / "scan.zarr"),
                 "--output-dir", str(tmp_path / "runs"), *COMMON])
    err = capsys.readouterr().err
    assert code != 0 and "Traceback" not in err
    line = next(line for line in err.splitlines() if "error:" in line)
    assert named in line and option in line
    assert not (tmp_path / "scan.zarr").exists() and not (tmp_path / "runs").exists()


def test_a_missing_cxi_field_given_by_attr_converts(tmp_path):
    _cxi(tmp_path / "scan.cxi", drop="entry_1/instrument_1/detector_1/distance")
    ds, _ = io.read_source(tmp_path / "scan.cxi", attrs={"detector_distance": "0.5"})
    assert ds.attrs["detector_distance"] == 0.5
