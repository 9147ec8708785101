"""Geometry: attrs round trip through the projections layout, row bands, refusals."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from outcore.errors import LayoutError
from outcore.io.layouts import validate
from outcore.tomo import Geometry, kernels, scan_for, uniform_angles


def _dataset(geometry: Geometry) -> xr.Dataset:
    data = np.zeros(geometry.projection_shape, np.float32)
    return xr.Dataset({"projections": (("view", "v", "u"), data),
                       "angles": (("view",), geometry.angles)}, attrs=geometry.to_attrs())


@pytest.mark.parametrize("kind", ["parallel", "cone"])
def test_attrs_round_trip_through_the_projections_layout(kind):
    extra = {"source_distance": 500.0, "detector_distance": 300.0} if kind == "cone" else {}
    geometry = Geometry(kind, uniform_angles(7, kind), (5, 9), (0.2, 0.3), voxel_size=0.25,
                        detector_offset=(0.1, -0.4), **extra)
    ds = _dataset(geometry)
    assert validate(ds) == "projections"
    assert Geometry.from_attrs(ds) == geometry


def test_default_voxel_is_the_pixel_at_the_axis():
    cone = Geometry.cone(uniform_angles(4, "cone"), (4, 6), 100.0, 300.0, detector_pixel_size=2.0)
    ds = _dataset(cone)
    del ds.attrs["voxel_size"]
    assert Geometry.from_attrs(ds).voxel_size == pytest.approx(0.5)
    assert Geometry.from_attrs(ds, voxel_size=0.1).voxel_size == 0.1


def test_refusals_name_the_fix():
    with pytest.raises(ValueError, match="source_distance"):
        Geometry("cone", [0.0], (2, 2))
    with pytest.raises(ValueError, match="kind"):
        Geometry("fan", [0.0], (2, 2))
    ds = _dataset(Geometry.parallel([0.0, 1.0], (2, 3)))
    ds.attrs["voxel_size"] = [1.0, 2.0, 2.0]
    with pytest.raises(LayoutError, match="isotropic"):
        Geometry.from_attrs(ds)
    with pytest.raises(ValueError, match="source circle"):
        Geometry.cone([0.0], (4, 4), 10.0, 10.0).check_volume((8, 16, 16))


@pytest.mark.parametrize("kind", ["parallel", "cone"])
def test_rows_outside_a_slab_band_receive_nothing(kind):
    shape = (12, 10, 10)
    extra = {"source_distance": 30.0, "detector_distance": 20.0} if kind == "cone" else {}
    geometry = Geometry(kind, uniform_angles(6, kind), (20, 16), (0.9, 1.2),
                        detector_offset=(0.7, 0.0), **extra)
    slab = np.ones((4, 10, 10), np.float32)
    for z0 in (0, 4, 8):
        v0, v1 = geometry.row_band(z0, z0 + 4, shape)
        full = kernels.forward(slab, geometry.angles, geometry, z0=z0, depth=12)
        assert full[:, v0:v1].any()
        assert not full[:, :v0].any() and not full[:, v1:].any()


@pytest.mark.parametrize("kind", ["parallel", "cone"])
def test_scan_for_sees_the_whole_volume(kind):
    shape = (10, 12, 16)
    geometry = scan_for(kind, shape, 8, voxel_size=0.5)
    projections = kernels.forward(np.ones(shape), geometry.angles, geometry)
    assert not projections[:, :, [0, -1]].any()
    if kind == "cone":
        assert not projections[:, [0, -1]].any()
    else:
        assert geometry.detector_shape[0] == shape[0]
    assert geometry.n_views == 8 and geometry.voxel_size == 0.5
