"""Raw beamline HDF5 scans -> the projections layout, normalised lazily block by block."""

from __future__ import annotations

import numpy as np
import pytest

import outcore
from outcore.errors import LayoutError
from outcore.io.importers.hdf5 import HDF5Frames
from outcore.tomo.raw.beamline import read_beamline_hdf5
from outcore.tomo.raw.normalise import normalise

h5py = pytest.importorskip("h5py")
VIEWS, NV, NU = 12, 6, 10


def _scan(path, *, flats=None, theta=None):
    rng = np.random.default_rng(0)
    p = rng.random((VIEWS, NV, NU)) * 3.0  # the line integrals the normalisation recovers
    dark = 100.0 + rng.random((3, NV, NU))
    flat = 4000.0 + 50.0 * rng.random((5, NV, NU)) if flats is None else flats
    raw = dark.mean(0) + (flat.mean(0) - dark.mean(0)) * np.exp(-p)
    with h5py.File(path, "w") as f:
        f["/exchange/data"] = raw.astype(np.float64)
        f["/exchange/data_white"] = flat
        f["/exchange/data_dark"] = dark
        f["/exchange/theta"] = np.linspace(0, 180, VIEWS, endpoint=False) if theta is None \
            else theta
    return p


def test_normalise_recovers_the_line_integrals_and_clips():
    p = np.array([[0.0, 1.0, 2.5]])
    dark, flat = np.array([10.0, 10.0, 10.0]), np.array([110.0, 110.0, 110.0])
    raw = dark + (flat - dark) * np.exp(-p)
    got = normalise(raw, flat, dark)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, p, rtol=1e-5, atol=1e-6)
    # below the dark: clipped to eps; a dead pixel (flat == dark): 0, never NaN/Inf
    got = normalise(np.array([5.0, 50.0]), np.array([110.0, 10.0]), np.array([10.0, 10.0]))
    np.testing.assert_allclose(got, [-np.log(np.float32(1e-6)), 0.0], rtol=1e-6)


def test_read_is_lazy_exact_and_saves_as_projections(tmp_path, monkeypatch):
    path = tmp_path / "scan.h5"
    p = _scan(path)
    ds = read_beamline_hdf5(path, detector_pixel_size=1e-6, frames_per_chunk=4)
    proj = ds["projections"]
    assert proj.dims == ("view", "v", "u") and proj.dtype == np.float32
    assert proj.data.chunks[0] == (4, 4, 4)
    np.testing.assert_allclose(ds["angles"].values, np.deg2rad(np.linspace(0, 180, VIEWS,
                                                                            endpoint=False)))
    reads = []
    original = HDF5Frames.read
    monkeypatch.setattr(HDF5Frames, "read",
                        lambda self, a, b: reads.append((a, b)) or original(self, a, b))
    block = proj[4:8].values  # one block: one read of its frames only
    assert reads == [(4, 8)]
    np.testing.assert_allclose(block, p[4:8], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(proj.values, p, rtol=1e-4, atol=1e-5)
    outcore.save(ds, tmp_path / "proj.zarr")
    back = outcore.open(tmp_path / "proj.zarr", layout="projections")
    np.testing.assert_allclose(back["projections"].values, p, rtol=1e-4, atol=1e-5)
    assert back.attrs["geometry"] == "parallel"


def test_clear_errors(tmp_path):
    path = tmp_path / "scan.h5"
    _scan(path)
    with pytest.raises(LayoutError, match="/exchange/data_white"):
        read_beamline_hdf5(path, flats="/exchange/nope", detector_pixel_size=1.0)
    with pytest.raises(LayoutError, match="12 frames"):
        _scan(path, theta=np.zeros(5))
        read_beamline_hdf5(path, detector_pixel_size=1.0)
    with pytest.raises(LayoutError, match="every pixel"):
        _scan(path, flats=np.full((2, NV, NU), 50.0))
        read_beamline_hdf5(path, detector_pixel_size=1.0)
    with pytest.raises(LayoutError, match="shape"):
        _scan(path)
        with h5py.File(path, "a") as f:
            del f["/exchange/data_white"]
            f["/exchange/data_white"] = np.full((2, NV, NU + 1), 5000.0)
        read_beamline_hdf5(path, detector_pixel_size=1.0)
    # no pixel size anywhere: a parallel beam is measured in pixels, a cone is refused
    _scan(path)
    unsized = read_beamline_hdf5(path)
    assert unsized.attrs["detector_pixel_size"] == 1.0
    assert unsized.attrs["length_unit"] == "pixel"
    with pytest.raises(LayoutError, match="cone-beam scan needs the detector pixel size"):
        read_beamline_hdf5(path, geometry="cone", source_distance=1.0, detector_distance=1.0)


@pytest.mark.parametrize("suffix", [".txt", ".csv", ".npy"])
def test_angles_from_a_file_of_their_own(tmp_path, suffix):
    """--angles names a text or .npy file beside the scan: its values replace the file's
    /exchange/theta (here 1-degree steps against a stored 180/12)."""
    path = tmp_path / "scan.h5"
    _scan(path)
    degrees = np.arange(VIEWS, dtype=np.float64) * 15.0
    angles = tmp_path / f"angles{suffix}"
    if suffix == ".npy":
        np.save(angles, degrees)
    else:
        np.savetxt(angles, degrees[None] if suffix == ".csv" else degrees,
                   delimiter="," if suffix == ".csv" else " ")
    ds = read_beamline_hdf5(path, angles=str(angles), detector_pixel_size=1e-6)
    np.testing.assert_allclose(ds["angles"].values, np.deg2rad(degrees))


def test_an_angles_file_that_is_missing_empty_or_short_is_named(tmp_path):
    from outcore.errors import InputNotFoundError

    path = tmp_path / "scan.h5"
    _scan(path)
    with pytest.raises(InputNotFoundError, match="angles='nope.txt': no such file"):
        read_beamline_hdf5(path, angles="nope.txt", detector_pixel_size=1e-6)
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(LayoutError, match="holds no angles"):
        read_beamline_hdf5(path, angles=str(tmp_path / "empty.txt"), detector_pixel_size=1e-6)
    np.savetxt(tmp_path / "short.txt", np.arange(5.0))
    with pytest.raises(LayoutError, match=r"short.txt' holds 5 angles but .* holds 12 frames"):
        read_beamline_hdf5(path, angles=str(tmp_path / "short.txt"), detector_pixel_size=1e-6)


def test_phase_retrieval_of_a_scan_in_pixels_asks_for_the_pixel_size(tmp_path, capsys):
    """A scan measured in pixels reconstructs, but Paganin's filter is a length: refused in
    one line before anything starts, naming the option."""
    from outcore.cli import main

    path = tmp_path / "scan.h5"
    _scan(path)
    assert main(["tomo", "reconstruct", "--input", str(path), "--paganin", "100", "--energy",
                 "20", "--propagation-distance", "0.1", "--cluster", "threads",
                 "--output-dir", str(tmp_path / "runs")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Paganin's filter needs the pixel size in metres" in err[0]
    assert "--attr detector_pixel_size=" in err[0]
    assert not (tmp_path / "runs").exists()
