"""save/open round trips of every layout, and saves that must leave nothing behind."""

import dask.array as da
import numpy as np
import pytest
import xarray as xr

import outcore
from outcore.errors import LayoutError, RunExistsError
from outcore.io import InputNotFoundError

RNG = np.random.default_rng(1)


def grid() -> xr.Dataset:
    return xr.Dataset(
        {"data": (("scan_y", "scan_x", "k_y", "k_x"), RNG.integers(0, 99, (3, 4, 5, 5), "u4"))},
        attrs={"wavelength": 2.5e-12, "scan_step": [1e-9, 2e-9], "reciprocal_pixel_size": 1e7},
    )


def position_list() -> xr.Dataset:
    return xr.Dataset(
        {"data": (("position", "k_y", "k_x"), RNG.random((7, 4, 6), dtype="float32")),
         "positions": (("position", "xy"), RNG.random((7, 2)) * 1e-6)},
        coords={"xy": ["x", "y"]},
        attrs={"energy": 300e3, "detector_pixel_size": [55e-6, 75e-6], "detector_distance": 1.5},
    )


def volume() -> xr.Dataset:
    return xr.Dataset({"volume": (("z", "y", "x"), RNG.random((9, 4, 3)))},
                      attrs={"voxel_size": [1e-6, 1e-6, 2e-6]})


def projections() -> xr.Dataset:
    return xr.Dataset(
        {"projections": (("view", "v", "u"), RNG.random((8, 3, 5), dtype="float32"))},
        coords={"angles": ("view", np.linspace(0, np.pi, 8, endpoint=False))},
        attrs={"geometry": "cone", "detector_pixel_size": 1e-4, "source_distance": 0.5,
               "detector_distance": 0.25},
    )


def cutouts() -> xr.Dataset:
    images = RNG.random((6, 5, 5), dtype="float32")
    images[2, 0, 0] = np.nan
    return xr.Dataset({
        "images": (("candidate", "y", "x"), images),
        "variance": (("candidate", "y", "x"), RNG.random((6, 5, 5))),
        "mask": (("candidate", "y", "x"), RNG.random((6, 5, 5)) > 0.8),
        "candidate_id": ("candidate", np.array(["sn-1", "sn-22", "c", "d", "e", "f"])),
        "center_x": ("candidate", RNG.random(6)),
    })


MAKERS = [grid, position_list, volume, projections, cutouts]


def assert_same(read: xr.Dataset, written: xr.Dataset, layout: str) -> None:
    assert read.attrs == {**written.attrs, "outcore_layout": layout}
    assert set(read.variables) == set(written.variables)
    for name, var in written.variables.items():
        got = read[name]
        assert got.dims == var.dims, name
        assert got.dtype == var.dtype or var.dtype.kind == "U", name
        np.testing.assert_array_equal(got.values, var.values, err_msg=name)
    assert set(read.coords) == set(written.coords)


@pytest.mark.parametrize("make", MAKERS)
def test_round_trip(tmp_path, make):
    ds = make()
    path = outcore.save(ds, tmp_path / "out.zarr")
    assert path == tmp_path / "out.zarr" and sorted(p.name for p in tmp_path.iterdir()) == [
        "out.zarr"]
    read = outcore.open(path)
    layout = read.attrs["outcore_layout"]
    assert layout == outcore.io.detect_layout(ds)
    main = outcore.io.LAYOUTS[layout].main.name
    assert isinstance(read[main].data, da.Array)
    assert_same(read, ds, layout)
    assert outcore.io.validate(read, check_values=True) == layout


def test_chunks_given_per_dim_become_zarr_chunks(tmp_path):
    ds = volume()
    read = outcore.open(outcore.save(ds, tmp_path / "v.zarr", chunks={"z": 4, "x": 2}))
    assert read.volume.chunks == ((4, 4, 1), (4,), (2, 1))
    assert read.volume.encoding["chunks"] == (4, 4, 2)
    assert outcore.open(tmp_path / "v.zarr", chunks={"z": 9}).volume.chunks[0] == (9,)


def test_irregular_dask_chunks_are_made_regular(tmp_path):
    ds = projections()
    ds = ds.chunk({"view": (3, 1, 4), "v": 3, "u": 5})
    read = outcore.open(outcore.save(ds, tmp_path / "p.zarr"))
    assert read.projections.chunks[0] == (4, 4)
    assert read.angles.chunks == ((4, 4),)
    np.testing.assert_array_equal(read.projections.values, ds.projections.values)


def test_numpy_input_gets_frame_blocks(tmp_path):
    read = outcore.open(outcore.save(position_list(), tmp_path / "d.zarr"))
    assert read.data.chunks == ((7,), (4,), (6,))  # small: one block of whole frames
    assert read.positions.chunks == ((7,), (2,))


def test_nan_in_last_block_fails_and_leaves_nothing(tmp_path):
    ds = volume().chunk({"z": 2})
    ds["volume"] = ds.volume.where((ds.z != 8) | (ds.y != 3), np.nan)  # last block only
    with pytest.raises(LayoutError, match=r"volume has 3 non-finite values .* \(8, 3, 0\)") as err:
        outcore.save(ds, tmp_path / "v.zarr")
    assert "fillna" in err.value.fix
    assert list(tmp_path.iterdir()) == []


def test_nan_in_projection_angles_refused(tmp_path):
    ds = projections()
    ds["angles"] = ds.angles.where(ds.view != 7)
    with pytest.raises(LayoutError, match="angles has 1 non-finite"):
        outcore.save(ds, tmp_path / "p.zarr")
    assert list(tmp_path.iterdir()) == []


def test_invalid_dataset_writes_nothing(tmp_path):
    ds = volume().assign_attrs(voxel_size=-1.0)
    with pytest.raises(LayoutError, match="voxel_size"):
        outcore.save(ds, tmp_path / "v.zarr")
    with pytest.raises(LayoutError, match=r"chunks names dims \['t'\]"):
        outcore.save(volume(), tmp_path / "v.zarr", chunks={"t": 2})
    assert list(tmp_path.iterdir()) == []


def test_existing_output_is_never_overwritten(tmp_path):
    path = outcore.save(volume(), tmp_path / "v.zarr")
    before = outcore.open(path).volume.values
    with pytest.raises(RunExistsError, match="already exists; outcore never overwrites"):
        outcore.save(volume(), path)
    np.testing.assert_array_equal(outcore.open(path).volume.values, before)


def test_open_errors(tmp_path):
    with pytest.raises(InputNotFoundError, match="does not exist"):
        outcore.open(tmp_path / "missing.zarr")
    (tmp_path / "plain").mkdir()
    with pytest.raises(LayoutError, match="is not a zarr store"):
        outcore.open(tmp_path / "plain")
    xr.Dataset({"t": ("x", np.arange(3.0))}).to_zarr(tmp_path / "other.zarr", zarr_format=3,
                                                    consolidated=False)
    with pytest.raises(LayoutError, match="not an outcore layout") as err:
        outcore.open(tmp_path / "other.zarr")
    assert "convert" in err.value.fix


def test_layout_argument_checks_store(tmp_path):
    path = outcore.save(volume(), tmp_path / "v.zarr")
    with pytest.raises(LayoutError, match="attr is 'volume'"):
        outcore.open(path, layout="cutouts")
