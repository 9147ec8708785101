"""Layout validation: each layout accepted, each kind of bad input refused with its fix."""

import subprocess
import sys

import numpy as np
import pytest
import xarray as xr

from outcore.errors import LayoutError
from outcore.io import LAYOUTS, detect_layout, validate

RNG = np.random.default_rng(0)


def grid() -> xr.Dataset:
    data = RNG.poisson(5.0, (2, 3, 4, 4)).astype("uint16")
    return xr.Dataset(
        {"data": (("scan_y", "scan_x", "k_y", "k_x"), data)},
        attrs={"wavelength": 2.5e-12, "scan_step": [1e-9, 2e-9], "reciprocal_pixel_size": 1e7},
    )


def positions() -> xr.Dataset:
    return xr.Dataset(
        {"data": (("position", "k_y", "k_x"), RNG.random((5, 4, 4), dtype="float32")),
         "positions": (("position", "xy"), RNG.random((5, 2)) * 1e-6)},
        coords={"xy": ["x", "y"]},
        attrs={"energy": 300e3, "detector_pixel_size": 55e-6, "detector_distance": 1.5},
    )


def volume() -> xr.Dataset:
    return xr.Dataset({"volume": (("z", "y", "x"), RNG.random((4, 3, 2)))},
                      attrs={"voxel_size": 1e-6})


def projections(geometry: str = "cone") -> xr.Dataset:
    return xr.Dataset(
        {"projections": (("view", "v", "u"), RNG.random((6, 3, 4), dtype="float32"))},
        coords={"angles": ("view", np.linspace(0, np.pi, 6, endpoint=False))},
        attrs={"geometry": geometry, "detector_pixel_size": [1e-4, 1e-4],
               "source_distance": 0.5, "detector_distance": 0.3},
    )


def cutouts() -> xr.Dataset:
    images = RNG.random((4, 5, 5), dtype="float32")
    images[1, 2, 2] = np.nan  # allowed: the fitter flags such candidates
    return xr.Dataset({
        "images": (("candidate", "y", "x"), images),
        "variance": (("candidate", "y", "x"), np.ones((4, 5, 5), "float32")),
        "mask": (("candidate", "y", "x"), np.zeros((4, 5, 5), bool)),
        "candidate_id": ("candidate", np.array(["a", "b", "c", "d"])),
        "center_x": ("candidate", np.arange(4.0)),
    })


VALID = {"diffraction": grid, "volume": volume, "projections": projections, "cutouts": cutouts}


@pytest.mark.parametrize("make", [grid, positions, volume, projections, cutouts])
def test_valid_datasets_pass_with_value_check(make):
    ds = make()
    name = validate(ds, check_values=True)
    assert name in LAYOUTS and detect_layout(ds) == name
    assert validate(ds, name) == name


def test_detect_from_attr_and_unknown():
    ds = volume().rename({"volume": "vol"})
    ds.attrs["outcore_layout"] = "volume"
    assert detect_layout(ds) == "volume"
    with pytest.raises(LayoutError, match="none of the variables"):
        detect_layout(ds.drop_attrs())
    with pytest.raises(LayoutError, match="not a known layout"):
        detect_layout(ds.assign_attrs(outcore_layout="movie"))


def _refused(ds, match, layout=None, check_values=False):
    with pytest.raises(LayoutError, match=match) as err:
        validate(ds, layout, check_values=check_values)
    assert err.value.fix, "every error names a fix"
    return err.value


def test_transposed_dims_suggest_transpose():
    err = _refused(projections().transpose("view", "u", "v"),
                   r"projections has dims \('view', 'u', 'v'\); expected \('view', 'v', 'u'\)")
    assert "ds.transpose('view', 'v', 'u'" in err.fix


def test_misnamed_dims_suggest_rename():
    err = _refused(volume().rename_dims(z="slice"), "volume has dims")
    assert "'slice': 'z'" in err.fix


@pytest.mark.parametrize("dtype", ["complex64", "int32", "float16"])
def test_wrong_volume_dtype(dtype):
    ds = volume()
    ds["volume"] = ds.volume.astype(dtype)
    err = _refused(ds, f"volume has dtype {dtype}; volume expects float32 or float64")
    assert "astype('float32')" in err.fix


def test_signed_diffraction_counts_refused_unsigned_accepted():
    ds = grid()
    assert validate(ds) == "diffraction"
    ds["data"] = ds.data.astype("int32")
    _refused(ds, "unsigned integers")


@pytest.mark.parametrize(("layout", "attr", "match"), [
    ("volume", "voxel_size", r"needs the attr voxel_size \[m\]"),
    ("diffraction", "wavelength", r"wavelength \[m\] or energy \[eV\]"),
    ("diffraction", "scan_step", r"scan_step \[m\]"),
    ("projections", "geometry", "geometry"),
    ("projections", "source_distance", r"source_distance \[m\] and detector_distance"),
])
def test_missing_attrs(layout, attr, match):
    ds = VALID[layout]()
    del ds.attrs[attr]
    _refused(ds, match)


def test_parallel_geometry_needs_no_distances():
    ds = projections("parallel")
    del ds.attrs["source_distance"], ds.attrs["detector_distance"]
    assert validate(ds) == "projections"


@pytest.mark.parametrize(("value", "match"), [
    (0.0, "finite and positive"),
    (-1e-6, "finite and positive"),
    ([1e-6, 1e-6], "expected a number or a list of 3"),
    ("1e-6", "expected a number"),
    (True, "expected a number"),
])
def test_bad_voxel_size(value, match):
    _refused(volume().assign_attrs(voxel_size=value), match)


def test_unknown_geometry():
    _refused(projections().assign_attrs(geometry="fan"), r"expected one of \['parallel', 'cone'\]")


def test_position_list_needs_positions_and_xy_labels():
    _refused(positions().drop_vars(["positions", "xy"]), "needs a variable 'positions'")
    _refused(positions().assign_coords(xy=["y", "x"]), r"coordinate xy=\['x', 'y'\]")
    err = _refused(positions().drop_vars("xy"), "coordinate")
    assert "assign_coords(xy=['x', 'y'])" in err.fix
    ds = positions()
    ds["positions"] = ds.positions.astype("float32")
    _refused(ds, "positions has dtype float32")


def test_grid_needs_no_positions_but_reciprocal_sampling():
    ds = grid()
    del ds.attrs["reciprocal_pixel_size"]
    _refused(ds, "reciprocal_pixel_size .* or detector_pixel_size .* and detector_distance")
    assert validate(ds.assign_attrs(detector_pixel_size=55e-6, detector_distance=2.0))


def test_cutouts_companions():
    ds = cutouts()
    _refused(ds.drop_vars("candidate_id"), "needs a variable 'candidate_id'")
    _refused(ds.assign(candidate_id=("candidate", ["a", "b", "a", "d"])), "1 repeated values")
    _refused(ds.assign(mask=ds.mask.astype("uint8")), "mask has dtype uint8; cutouts expects bool")
    small = xr.DataArray(np.ones((4, 3, 3), "float32"), dims=("candidate", "vy", "vx"))
    _refused(ds.assign(variance=small), r"variance has dims \('candidate', 'vy', 'vx'\)")
    assert validate(ds.drop_vars(["variance", "mask"])) == "cutouts"
    assert validate(ds.assign(candidate_id=("candidate", np.arange(4)))) == "cutouts"


def test_non_finite_values_need_check_values():
    ds = volume()
    ds.volume[3, 2, 1] = np.inf
    assert validate(ds) == "volume"
    _refused(ds, "volume has 1 non-finite values", check_values=True)
    ds = projections()
    ds["angles"] = ds.angles.where(ds.view != 2)
    _refused(ds.chunk({"view": 2}), "angles has 1 non-finite", check_values=True)


def test_layout_argument():
    with pytest.raises(LayoutError, match="Unknown layout 'movie'"):
        validate(volume(), "movie")
    _refused(volume().assign_attrs(outcore_layout="volume"), "attr is 'volume'", "cutouts")
    _refused(volume(), "needs a variable 'images'", "cutouts")


THREADED_OPENS = """
import sys, threading
import outcore

paths, errors = sys.argv[1:], []
start = threading.Barrier(2 * len(paths))

def open_one(path):
    start.wait()
    try:
        outcore.open(path)
    except Exception as err:
        errors.append(repr(err))

threads = [threading.Thread(target=open_one, args=(p,)) for p in paths * 2]
for t in threads:
    t.start()
for t in threads:
    t.join()
print("ERRORS", errors)
"""


def test_first_use_from_several_threads_sees_every_layout(tmp_path):
    """The registry loads the families' layouts once, under a lock: threads opening stores of
    two layouts at the same first use (a fresh interpreter) all find them."""
    import outcore

    stores = [str(outcore.save(make(), tmp_path / f"{make.__name__}.zarr"))
              for make in (projections, grid)]
    for _ in range(3):
        out = subprocess.run([sys.executable, "-c", THREADED_OPENS, *stores * 3],
                             capture_output=True, text=True, timeout=120, check=True).stdout
        assert "Unknown layout" not in out and "ERRORS []" in out, out
