"""Importers: real files written by h5py, tifffile, astropy and numpy, streamed into stores."""

import pickle

import dask
import dask.array as da
import h5py
import numpy as np
import pytest
import tifffile
import xarray as xr
from astropy.io import fits

import outcore
from outcore.errors import LayoutError, RunExistsError
from outcore.io import convert, detect_format, read_fits, read_hdf5, read_npz, read_tiff
from outcore.io.importers import native
from outcore.io.importers.hdf5 import HDF5Frames
from outcore.io.importers.npz import _members

RNG = np.random.default_rng(2)
PROJ_ATTRS = {"geometry": "parallel", "detector_pixel_size": "1e-4"}


def write_h5(path, **datasets):
    with h5py.File(path, "w") as f:
        for name, values in datasets.items():
            f.create_dataset(name, data=values, chunks=True if np.ndim(values) > 1 else None)
    return path


def test_hdf5_volume_round_trip(tmp_path):
    vol = RNG.random((10, 4, 6), dtype="float32")
    src = write_h5(tmp_path / "scan.h5", **{"entry/data/data": vol, "entry/other": np.arange(3)})
    out = convert(src, tmp_path / "v.zarr", layout="volume", dataset="/entry/data/data",
                  attrs={"voxel_size": "[1e-6, 1e-6, 2e-6]"}, frames_per_chunk=3)
    read = outcore.open(out)
    np.testing.assert_array_equal(read.volume.values, vol)
    assert read.volume.dtype == vol.dtype and read.volume.chunks[0] == (3, 3, 3, 1)
    assert read.attrs["voxel_size"] == [1e-6, 1e-6, 2e-6]


def test_hdf5_diffraction_grid_and_list(tmp_path):
    grid = RNG.integers(0, 2**16, (2, 3, 8, 8), dtype="uint16")
    stack = grid.reshape(6, 8, 8)
    pos = RNG.random((6, 2)) * 1e-6
    src = write_h5(tmp_path / "ptycho.nxs", **{"entry/data": grid, "entry/stack": stack,
                                               "entry/pos": pos})
    attrs = {"wavelength": "2.5e-12", "scan_step": "1e-9,2e-9", "reciprocal_pixel_size": 1e7}
    read = outcore.open(convert(src, tmp_path / "g.zarr", layout="diffraction",
                                dataset="/entry/data", attrs=attrs))
    np.testing.assert_array_equal(read.data.values, grid)
    assert read.data.dims == ("scan_y", "scan_x", "k_y", "k_x") and read.data.dtype == "uint16"
    assert read.attrs["scan_step"] == [1e-9, 2e-9]
    del attrs["scan_step"]
    read = outcore.open(convert(src, tmp_path / "l.zarr", layout="diffraction",
                                dataset="/entry/stack", attrs=attrs,
                                arrays={"positions": "/entry/pos"}))
    np.testing.assert_array_equal(read.data.values, stack)
    np.testing.assert_array_equal(read.positions.values, pos)
    assert list(read.xy.values) == ["x", "y"]


def test_hdf5_sinogram_order_transposed_by_dims(tmp_path):
    proj = RNG.random((6, 3, 5), dtype="float32")  # (view, v, u)
    angles = np.linspace(0, np.pi, 6)
    src = write_h5(tmp_path / "sino.h5", sino=proj.transpose(1, 0, 2), angles=angles)
    ds = read_hdf5(src, "sino", layout="projections", dims=("v", "view", "u"),
                   attrs=PROJ_ATTRS, arrays={"angles": "angles"})
    assert ds.projections.dims == ("view", "v", "u")
    read = outcore.open(outcore.save(ds, tmp_path / "p.zarr"))
    np.testing.assert_array_equal(read.projections.values, proj)
    np.testing.assert_array_equal(read.angles.values, angles)


def test_hdf5_wrong_dataset_lists_the_available_ones(tmp_path):
    src = write_h5(tmp_path / "scan.h5", **{"entry/data/data": np.zeros((2, 3, 4), "f4")})
    listing = r"no dataset '/entry/data'.*datasets are: /entry/data/data \(2, 3, 4\) float32"
    with pytest.raises(LayoutError, match=listing):
        convert(src, tmp_path / "v.zarr", layout="volume", dataset="/entry/data",
                attrs={"voxel_size": 1.0})
    assert not (tmp_path / "v.zarr").exists()
    # the only dataset with 2 or more axes is picked when none is named
    assert read_hdf5(src, None, layout="volume").volume.shape == (2, 3, 4)


def test_readers_read_only_their_frames(tmp_path, monkeypatch):
    vol = RNG.random((10, 4, 6), dtype="float32")
    src = write_h5(tmp_path / "scan.h5", data=vol)
    ds = read_hdf5(src, "data", layout="volume", frames_per_chunk=4)
    assert isinstance(ds.volume.data, da.Array) and ds.volume.chunks[0] == (4, 4, 2)
    reads = []
    original = HDF5Frames.read

    def spy(self, start, stop):
        reads.append((start, stop))
        return original(self, start, stop)

    monkeypatch.setattr(HDF5Frames, "read", spy)
    block = ds.volume.data.blocks[1].compute(scheduler="sync")
    assert reads == [(4, 8)]
    np.testing.assert_array_equal(block, vol[4:8])


def test_readers_pickle_and_read_in_another_object(tmp_path):
    vol = RNG.random((5, 2, 3), dtype="float32")
    src = write_h5(tmp_path / "scan.h5", data=vol)
    reader = HDF5Frames((5, 2, 3), np.dtype("float32"), str(src), "/data")
    clone = pickle.loads(pickle.dumps(reader))
    np.testing.assert_array_equal(clone[1:3, :, :], vol[1:3])


def test_tiff_multipage_round_trip(tmp_path):
    proj = RNG.integers(0, 4000, (7, 5, 6)).astype("float32")
    tifffile.imwrite(tmp_path / "stack.tif", proj, photometric="minisblack")
    angles = np.linspace(0, np.pi, 7)
    ds = read_tiff(tmp_path / "stack.tif", layout="projections", attrs=PROJ_ATTRS,
                   arrays={"angles": angles}, frames_per_chunk=2)
    assert ds.projections.chunks[0] == (2, 2, 2, 1)
    read = outcore.open(outcore.save(ds, tmp_path / "p.zarr"))
    np.testing.assert_array_equal(read.projections.values, proj)
    np.testing.assert_array_equal(read.angles.values, angles)
    assert read.attrs["detector_pixel_size"] == 1e-4


@pytest.mark.parametrize("pattern", ["{dir}", "{dir}/frame_*.tiff"])
def test_tiff_directory_of_single_pages(tmp_path, pattern):
    vol = RNG.random((12, 3, 4)).astype("float32")
    folder = tmp_path / "frames"
    folder.mkdir()
    for i, frame in enumerate(vol):  # frame_2 must come before frame_10
        tifffile.imwrite(folder / f"frame_{i}.tiff", frame)
    source = pattern.format(dir=folder)
    out = convert(source, tmp_path / "v.zarr", layout="volume", attrs={"voxel_size": "2e-6"},
                  frames_per_chunk=5)
    np.testing.assert_array_equal(outcore.open(out).volume.values, vol)
    # one frame by its index, as xarray asks for it (dask hands the reader an int)
    lazy = read_tiff(source, layout="volume", frames_per_chunk=5).volume
    np.testing.assert_array_equal(lazy[7].values, vol[7])
    np.testing.assert_array_equal(lazy[-1, 1].values, vol[-1, 1])


@pytest.mark.parametrize("pattern", ["{dir}", "{dir}/e_*.fits"])
def test_fits_directory_or_glob_of_images(tmp_path, pattern):
    """A night's exposures as one FITS file each (big-endian, scaled ints in an extension):
    the frames in natural order, BSCALE/BZERO applied, as astropy reads each file."""
    counts = RNG.integers(0, 60000, (11, 4, 5)).astype(np.uint16)
    folder = tmp_path / "night"
    folder.mkdir()
    for i, frame in enumerate(counts):  # e_2 must come before e_10
        fits.HDUList([fits.PrimaryHDU(), fits.ImageHDU(frame, name="SCI")]).writeto(
            folder / f"e_{i}.fits")
    (folder / "notes.txt").write_text("not an exposure")
    source = pattern.format(dir=folder)
    assert detect_format(source) == "fits"
    read = read_fits(source, layout="volume", frames_per_chunk=4).volume
    assert read.chunks[0] == (4, 4, 3)
    np.testing.assert_array_equal(read.values, counts)
    np.testing.assert_array_equal(read[10].values, counts[10])
    with fits.open(folder / "e_7.fits") as hdul:
        assert read.dtype == native(hdul["SCI"].data.dtype) == np.uint16


def test_fits_cube_image_and_hdu(tmp_path):
    cube = RNG.random((6, 4, 5)).astype(">f4")
    fits.HDUList([fits.PrimaryHDU(), fits.ImageHDU(cube, name="SCI")]).writeto(tmp_path / "c.fits")
    out = convert(tmp_path / "c.fits", tmp_path / "c.zarr", layout="volume",
                  attrs={"voxel_size": 1.0}, frames_per_chunk=4)
    read = outcore.open(out)
    np.testing.assert_array_equal(read.volume.values, cube)
    assert read.volume.dtype == "float32"

    image = RNG.random((4, 5))
    fits.HDUList([fits.PrimaryHDU(image), fits.ImageHDU(cube, name="SCI")]).writeto(
        tmp_path / "two.fits")
    assert read_fits(tmp_path / "two.fits", layout="volume").volume.shape == (1, 4, 5)
    ds = read_fits(tmp_path / "two.fits", layout="volume", hdu="SCI")
    np.testing.assert_array_equal(ds.volume.values, cube)
    with pytest.raises(LayoutError, match="no image HDU 'NOPE'.*'SCI' \\(6, 4, 5\\)"):
        read_fits(tmp_path / "two.fits", layout="volume", hdu="NOPE")


def write_catalog(path, compressed, n=9):
    arrays = {
        "images": RNG.random((n, 5, 5), dtype="float32"),
        "variance": RNG.random((n, 5, 5), dtype="float32"),
        "mask": RNG.random((n, 5, 5)) > 0.7,
        "candidate_id": np.array([f"cand-{i}" for i in range(n)]),
        "center_x": RNG.random(n),
    }
    arrays["images"][3, 1, 1] = np.nan  # cutouts allow NaN
    (np.savez_compressed if compressed else np.savez)(path, **arrays)
    return arrays


@pytest.mark.parametrize("compressed", [False, True])
def test_npz_round_trip(tmp_path, compressed):
    arrays = write_catalog(tmp_path / "cat.npz", compressed)
    ds = read_npz(tmp_path / "cat.npz", frames_per_chunk=2)
    assert all(isinstance(ds[name].data, da.Array) for name in arrays)
    assert (ds.images.data.npartitions, ds.candidate_id.data.npartitions) == (5, 5)
    # blocks in any order, several threads: the result does not depend on it
    blocks = [ds.images.data.blocks[i] for i in (4, 0, 2, 1, 3)]
    for block, i in zip(dask.compute(*blocks, scheduler="threads"), (4, 0, 2, 1, 3), strict=True):
        np.testing.assert_array_equal(block, arrays["images"][2 * i: 2 * i + 2])
    out = convert(tmp_path / "cat.npz", tmp_path / "cat.zarr", chunks={"candidate": 4})
    read = outcore.open(out)
    assert read.attrs["outcore_layout"] == "cutouts" and read.images.chunks[0] == (4, 4, 1)
    for name, values in arrays.items():
        np.testing.assert_array_equal(read[name].values, values, err_msg=name)
        assert read[name].dims[0] == "candidate"


def test_npz_members_are_mapped_or_streamed(tmp_path):
    write_catalog(tmp_path / "plain.npz", compressed=False)
    write_catalog(tmp_path / "packed.npz", compressed=True)
    plain, packed = _members(tmp_path / "plain.npz"), _members(tmp_path / "packed.npz")
    assert all(reader.offset is not None for reader in plain.values())
    assert all(reader.offset is None for reader in packed.values())
    with np.load(tmp_path / "plain.npz") as ref:  # a mapped block equals numpy's own reading
        np.testing.assert_array_equal(plain["variance"][3:5], ref["variance"][3:5])


def test_npz_errors(tmp_path):
    np.savez(tmp_path / "a.npz", candidate_id=np.arange(3))
    with pytest.raises(LayoutError, match=r"has no array 'images'; it has \['candidate_id'\]"):
        read_npz(tmp_path / "a.npz")
    np.savez(tmp_path / "b.npz", images=np.zeros((3, 4, 4)), candidate_id=np.arange(2))
    with pytest.raises(LayoutError, match=r"candidate_id .* has shape \(2,\); expected \(3,\)"):
        read_npz(tmp_path / "b.npz")
    np.savez(tmp_path / "c.npz", images=np.zeros((3, 4, 4)), candidate_id=np.arange(3),
             variance=np.ones((3, 5, 5)))
    with pytest.raises(LayoutError, match=r"variance .* expected \(3, 4, 4\) \(the shape of"):
        convert(tmp_path / "c.npz", tmp_path / "c.zarr")
    with pytest.raises(LayoutError, match="npz catalog holds cutouts, not volume"):
        convert(tmp_path / "c.npz", tmp_path / "c.zarr", layout="volume")
    assert not (tmp_path / "c.zarr").exists()


def test_zarr_relayout_and_rechunk(tmp_path):
    proj = RNG.random((6, 3, 5), dtype="float32")
    plain = xr.Dataset({"projections": (("a", "b", "c"), proj.transpose(0, 2, 1))})
    plain.to_zarr(tmp_path / "plain.zarr", zarr_format=3, consolidated=False)
    out = convert(tmp_path / "plain.zarr", tmp_path / "p.zarr", layout="projections",
                  dims=("view", "u", "v"), attrs=PROJ_ATTRS,
                  arrays={"angles": np.linspace(0, 1, 6)})
    read = outcore.open(out)
    np.testing.assert_array_equal(read.projections.values, proj)
    again = outcore.open(convert(out, tmp_path / "p2.zarr", chunks={"view": 2}))
    assert again.projections.chunks[0] == (2, 2, 2)
    np.testing.assert_array_equal(again.projections.values, proj)


def test_convert_errors(tmp_path):
    (tmp_path / "x.dat").write_bytes(b"1")
    with pytest.raises(LayoutError, match=r"Cannot tell the format of .*x.dat.* suffix '.dat'"):
        convert(tmp_path / "x.dat", tmp_path / "o.zarr")
    with pytest.raises(outcore.io.InputNotFoundError):
        convert(tmp_path / "missing.h5", tmp_path / "o.zarr", layout="volume")
    src = write_h5(tmp_path / "s.h5", data=np.zeros((2, 3, 3), "f4"), line=np.zeros(5))
    with pytest.raises(LayoutError, match="does not say which layout") as err:
        convert(src, tmp_path / "o.zarr")
    assert "layout=" in err.value.fix
    with pytest.raises(LayoutError, match="hdu= does not apply to hdf5"):
        convert(src, tmp_path / "o.zarr", layout="volume", hdu=1)
    with pytest.raises(LayoutError, match=r"line has shape \(5,\) \(1 axes\); volume expects"):
        convert(src, tmp_path / "o.zarr", layout="volume", dataset="line")
    with pytest.raises(LayoutError, match="needs a variable 'positions'") as err:
        convert(src, tmp_path / "o.zarr", layout="diffraction", dataset="data")
    assert "arrays={'positions'" in err.value.fix
    with pytest.raises(LayoutError, match=r"dims=\('z', 'y'\) names 2 axes"):
        convert(src, tmp_path / "o.zarr", layout="volume", dims=("z", "y"))
    with pytest.raises(LayoutError, match=r"angles has shape \(3,\); projections needs"):
        convert(src, tmp_path / "o.zarr", layout="projections", attrs=PROJ_ATTRS,
                arrays={"angles": [0.0, 1.0, 2.0]})
    with pytest.raises(LayoutError, match=r"needs the attr voxel_size \[m\]"):
        convert(src, tmp_path / "o.zarr", layout="volume")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.h5", "x.dat"]
    (tmp_path / "o.zarr").mkdir()
    with pytest.raises(RunExistsError):
        convert(src, tmp_path / "o.zarr", layout="volume", attrs={"voxel_size": 1.0})


def test_the_registry_gives_formats_suffixes_and_refusals(tmp_path):
    """Formats, suffixes, directory and glob detection and the option refusals all come from
    the importers' records."""
    from outcore.io import detect_format, read_source
    from outcore.io.convert import FORMATS, SUFFIXES
    from outcore.io.importers import Importer
    from outcore.io.importers.registry import IMPORTERS

    assert FORMATS == tuple(imp.name for imp in IMPORTERS) == (
        "hdf5", "cxi", "tiff", "fits", "npz", "npy", "raw", "zarr")
    assert list(SUFFIXES) == [".h5", ".hdf5", ".hdf", ".nxs", ".nx5", ".cxi", ".tif", ".tiff",
                              ".fits", ".fit", ".fts", ".npz", ".npy", ".raw", ".bin", ".zarr"]
    store = tmp_path / "store"
    store.mkdir()
    (store / "zarr.json").write_text("{}")
    (tmp_path / "frames").mkdir()
    assert detect_format(store) == "zarr" and detect_format(tmp_path / "frames") == "tiff"
    assert detect_format(str(tmp_path / "f_*.tif")) == "tiff"
    src = write_h5(tmp_path / "s.h5", data=np.zeros((2, 3, 3), "f4"))
    for name in ("c.npz", "x.raw"):  # refused before they are read
        (tmp_path / name).write_bytes(b"")
    with pytest.raises(LayoutError, match=r"dtype= does not apply to hdf5 input \(only to raw\)"):
        read_source(src, layout="volume", dtype="u2")
    with pytest.raises(LayoutError, match=r"dims= does not apply to npz input \(only to hdf5, "
                       r"tiff, fits, npy, raw, zarr\)\."):
        read_source(tmp_path / "c.npz", dims=("candidate", "y", "x"))
    with pytest.raises(LayoutError, match="format='gif' is not known"):
        read_source(src, format="gif")
    with pytest.raises(LayoutError, match="raw file such as .* does not say its dtype"):
        read_source(tmp_path / "x.raw", layout="volume", shape=(2, 3, 3))
    with pytest.raises(ValueError, match="not in"):
        Importer("gif", (".gif",), ("frames",), read_tiff)


def test_convert_on_process_workers(tmp_path):
    """Readers work in other processes; a failed save there also leaves nothing behind."""
    distributed = pytest.importorskip("distributed")
    vol = RNG.random((8, 4, 4), dtype="float32")
    src = write_h5(tmp_path / "scan.h5", data=vol)
    bad = vol.copy()
    bad[1, 0, 0] = np.nan
    nan_src = write_h5(tmp_path / "nan.h5", data=bad)
    with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=True,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster):
        out = convert(src, tmp_path / "v.zarr", layout="volume", attrs={"voxel_size": 1.0},
                      frames_per_chunk=3)
        with pytest.raises(LayoutError, match=r"non-finite .* index \(1, 0, 0\)"):
            convert(nan_src, tmp_path / "nan.zarr", layout="volume", attrs={"voxel_size": 1.0},
                    frames_per_chunk=1)
    np.testing.assert_array_equal(outcore.open(out).volume.values, vol)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nan.h5", "scan.h5", "v.zarr"]
