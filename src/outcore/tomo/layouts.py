"""The ``volume`` and ``projections`` layouts, registered with ``outcore.io.layouts``
(docs/formats.md), and the datasets of the two layouts that the tomography verbs write."""

from __future__ import annotations

from typing import Any

import numpy as np
import xarray as xr

from outcore.backend import whole_floor
from outcore.checks import shape as shape_of
from outcore.io.layouts import FLOAT, Attr, Layout, Need, Var, register
from outcore.tomo.geometry import Geometry

#: ``length_unit`` of a scan whose pixel size nobody gave: its lengths (the detector pixel,
#: the voxel) are detector pixels, and the volume's values attenuation per pixel.
PIXEL_UNIT = "pixel"
#: The attr that says so (absent: lengths in metres).
LENGTH_UNIT = Attr("length_unit", "", "unit of the lengths: m (absent), or pixel when the"
                   " scan gave no pixel size", choices={"m": (), PIXEL_UNIT: ()})

VOLUME = register(Layout(
    "volume",
    "a 3-D volume",
    Var("volume", (("z", "y", "x"),), FLOAT, "voxel values", finite=True),
    attrs=(Attr("voxel_size", "m", "voxel edge, scalar or [z, y, x]", sizes=(1, 3)),
           LENGTH_UNIT),
    needs=(Need((("voxel_size",),)),),
))

PROJECTIONS = register(Layout(
    "projections",
    "tomographic projections (line integrals) over rotation angles",
    Var("projections", (("view", "v", "u"),), FLOAT, "projection values", finite=True),
    companions=(
        Var("angles", (("view",),), FLOAT, "rotation angle of each view [rad]", finite=True),
    ),
    attrs=(
        Attr("geometry", "", "beam geometry",
             choices={"parallel": (), "cone": ("source_distance", "detector_distance")}),
        Attr("detector_pixel_size", "m", "detector pixel pitch, scalar or [v, u]", sizes=(1, 2)),
        Attr("source_distance", "m", "source to rotation axis (cone)"),
        Attr("detector_distance", "m", "rotation axis to detector (cone)"),
        LENGTH_UNIT,
    ),
    needs=(Need((("geometry",),)), Need((("detector_pixel_size",),))),
))


#: Attrs of the ``angles`` coordinate.
ANGLE_ATTRS = {"units": "rad", "long_name": "rotation angle of each view"}


def projections_dataset(projections: Any, geometry: Geometry, shape: tuple[int, int, int],
                        phantom: str) -> xr.Dataset:
    """The ``projections`` layout of a simulated scan (dask data, geometry in attrs, the
    angles a coordinate of ``view`` in radians)."""
    attrs = {**geometry.to_attrs(), "volume_shape": list(shape), "phantom": phantom}
    return xr.Dataset({"projections": (("view", "v", "u"), projections)},
                      coords={"angles": ("view", np.asarray(geometry.angles), ANGLE_ATTRS)},
                      attrs=attrs)


def centres(n: int, spacing: float) -> np.ndarray:
    """The centres of ``n`` cells of ``spacing`` about 0: ``(i - (n - 1) / 2) * spacing``
    (the geometry's convention for voxels and detector pixels)."""
    return (np.arange(n) - (n - 1) / 2) * spacing


def volume_dataset(volume: Any, voxel_size: float, length_unit: str | None = None,
                   **attrs: Any) -> xr.Dataset:
    """The ``volume`` layout of a reconstruction: ``volume (z, y, x)`` (dask data, in
    attenuation per ``length_unit``) with the coordinates of the voxel centres (the rotation
    axis at x = y = 0) in ``length_unit`` (``m``, or ``pixel`` for a scan measured in
    pixels); ``voxel_size`` in the same unit (``voxel_size_unit``). ``attrs`` that are None
    are left out."""
    unit = length_unit or "m"
    coords = {dim: (dim, centres(n, voxel_size), {"units": unit, "long_name": f"{dim} of the"
                                                  " voxel centre"})
              for dim, n in zip(("z", "y", "x"), volume.shape, strict=True)}
    kept = {key: value for key, value in attrs.items() if value is not None}
    values = {"units": f"1/{unit}", "long_name": "linear attenuation coefficient"}
    return xr.Dataset({"volume": (("z", "y", "x"), volume, values)}, coords=coords,
                      attrs={"voxel_size": voxel_size, "voxel_size_unit": unit,
                             "length_unit": unit, **kept})


def default_volume_shape(ds: xr.Dataset, geometry: Geometry) -> tuple[int, ...]:
    """The store's ``volume_shape`` attr, else the detector's field of view at the axis."""
    if "volume_shape" in ds.attrs:
        return shape_of(ds.attrs["volume_shape"], "the store's volume_shape attr")
    nv, nu = geometry.detector_shape
    dv, du = geometry.detector_pixel_size
    scale = geometry.magnification * geometry.voxel_size
    n = max(1, whole_floor(nu * du / scale))
    return (max(1, whole_floor(nv * dv / scale)), n, n)
