"""Raw beamline scans in HDF5: frames, flats, darks and angles -> the ``projections`` layout.

The common layout (Data Exchange, as written by many synchrotron beamlines and read by tomopy)
holds the raw detector frames ``/exchange/data (view, v, u)``, the open-beam frames
``/exchange/data_white`` (flats), the closed-shutter frames ``/exchange/data_dark`` (darks) and
the rotation angles ``/exchange/theta`` (degrees). :func:`read_beamline_hdf5` streams the raw
frames block by block (``outcore.io.importers.hdf5.HDF5Frames``: a task opens the file, reads
its frames and closes it), averages the flats and darks once (they are small) and applies
:func:`normalise` to each block lazily::

    projections = -log(clip((raw - dark) / (flat - dark), eps, None))    # float32

so the result is a lazy dataset of the ``projections`` layout that ``outcore.save`` writes
chunk by chunk and ``outcore.tomo`` reconstructs, without the stack ever being in memory.
:func:`read_beamline_source` is the same reader behind ``outcore convert --beamline``: it
refuses the convert options that do not apply, takes the geometry from ``--attr`` and
validates the result against the layout, all before any frame is read.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from os import PathLike
from typing import Any, Literal

import dask.array as da
import numpy as np
import xarray as xr

from outcore.backend import array_namespace
from outcore.checks import existing_path
from outcore.errors import LayoutError
from outcore.io.convert import detect_format
from outcore.io.importers import frames_dataset, native, parse_attrs, require
from outcore.io.importers.hdf5 import HDF5Frames, _dataset
from outcore.io.layouts import validate
from outcore.plan import TaskMemory

#: Smallest transmission kept before the log (a dead or saturated pixel gives -log(eps)).
EPS = 1e-6

#: The Data Exchange paths read when none are given (``outcore convert --beamline``).
DXCHANGE = {"data": "/exchange/data", "flats": "/exchange/data_white",
            "darks": "/exchange/data_dark", "angles": "/exchange/theta"}

#: Attrs of the projections layout that ``read_beamline_hdf5`` takes as keywords.
GEOMETRY_ATTRS = ("geometry", "detector_pixel_size", "source_distance", "detector_distance")

#: Scratch of :func:`normalise` in float32 blocks besides its input and output (measured with
#: tracemalloc: 3 for float32 frames, 3 plus the float32 copy of integer or float64 frames).
NORMALISE_SCRATCH_BLOCKS = 3


def normalise(raw: Any, flat: Any, dark: Any, *, eps: float = EPS) -> Any:
    """``-log(clip((raw - dark) / (flat - dark), eps, None))`` of one block, in float32.

    ``raw`` is ``(frames, v, u)`` (or one frame); ``flat`` and ``dark`` broadcast against it
    (``(v, u)`` averages). numpy or cupy arrays (the namespace of ``raw``). A pixel whose
    ``flat - dark`` is not positive carries no signal: its transmission is taken as 1 (value 0)
    rather than a NaN or Inf.
    """
    xp = array_namespace(raw)
    raw = xp.asarray(raw, dtype=xp.float32)
    flat = xp.asarray(flat, dtype=xp.float32)
    dark = xp.asarray(dark, dtype=xp.float32)
    denominator = flat - dark
    good = denominator > 0
    ratio = (raw - dark) / xp.where(good, denominator, xp.float32(1))
    ratio = xp.where(good, ratio, xp.float32(1))
    return (-xp.log(xp.clip(ratio, xp.float32(eps), None))).astype(xp.float32)


def read_beamline_hdf5(
    path: str | PathLike[str],
    *,
    data: str = "/exchange/data",
    flats: str = "/exchange/data_white",
    darks: str | None = "/exchange/data_dark",
    angles: str = "/exchange/theta",
    angles_unit: Literal["degree", "radian"] = "degree",
    geometry: str = "parallel",
    detector_pixel_size: float | Sequence[float] | None = None,
    source_distance: float | None = None,
    detector_distance: float | None = None,
    attrs: Mapping[str, Any] | None = None,
    eps: float = EPS,
    frames_per_chunk: int | None = None,
) -> xr.Dataset:
    """The ``projections`` dataset of a raw HDF5 scan, normalised lazily block by block.

    ``data``, ``flats``, ``darks`` and ``angles`` are internal paths of the file (``darks=None``
    for a scan without darks: zero). Flats and darks are one frame ``(v, u)`` or a stack
    ``(n, v, u)``, averaged. ``angles_unit`` says whether ``angles`` holds degrees or radians
    (the layout stores radians). ``geometry``, ``detector_pixel_size`` (required, length per
    pixel, one number or ``[dv, u]``), ``source_distance`` and ``detector_distance`` (cone) and
    ``attrs`` become the dataset's attrs. Blocks hold ``frames_per_chunk`` frames (default
    ~64 MiB). Raises ``LayoutError`` naming the problem and its fix for a missing dataset,
    mismatched shapes, flats no brighter than darks anywhere, or one angle count not matching
    the frames.
    """
    h5py = require("h5py")
    path = existing_path(path, "HDF5 file")
    if angles_unit not in ("degree", "radian"):
        raise LayoutError(f"angles_unit={angles_unit!r} is not a unit of angle.",
                          "pass angles_unit='degree' or angles_unit='radian'.")
    if detector_pixel_size is None:
        raise LayoutError(
            "The projections layout needs the detector pixel size, which a raw scan's "
            "data/flats/darks/angles do not give.",
            "pass detector_pixel_size= the pixel pitch at the sample in metres (the camera "
            "pixel divided by the optical magnification, e.g. 6.5e-6 / 10), one number or "
            "[dv, du] (CLI: --attr detector_pixel_size=6.5e-7).",
        )
    with h5py.File(path, "r") as f:
        node = _named(f, data, "data", path, h5py)
        if node.ndim != 3:
            raise LayoutError(
                f"{data!r} in {str(path)!r} has shape {node.shape}; raw projections are "
                "(view, v, u), 3 axes.",
                "pass data= the internal path of the stack of raw frames.",
            )
        reader = HDF5Frames(tuple(node.shape), native(node.dtype), str(path), node.name)
        frame = tuple(node.shape[1:])
        flat = _average(f, flats, "flats", frame, path, h5py)
        dark = (np.zeros(frame, np.float64) if darks is None
                else _average(f, darks, "darks", frame, path, h5py))
        theta = np.asarray(_named(f, angles, "angles", path, h5py)[()],
                           dtype=np.float64).reshape(-1)
    n_views = reader.shape[0]
    if theta.size != n_views:
        raise LayoutError(
            f"{angles!r} holds {theta.size} angles but {data!r} holds {n_views} frames.",
            "point angles= at the rotation angle of each frame (one per frame), or data= at "
            "the matching stack.",
        )
    if not np.isfinite(theta).all():
        raise LayoutError(f"{angles!r} holds non-finite angles.",
                          "repair the angles or pass angles= another dataset.")
    if not (flat - dark > 0).any():
        raise LayoutError(
            f"flats {flats!r} minus darks {darks!r} is zero or negative at every pixel, so "
            "no transmission can be computed.",
            "check that flats= names the open-beam frames and darks= the closed-shutter "
            "frames (not swapped, not the same dataset).",
        )
    radians = np.deg2rad(theta) if angles_unit == "degree" else theta
    raw = reader.to_dask(frames_per_chunk)
    ny, nx = frame
    flat_d = da.from_array(flat.astype(np.float32), chunks=(ny, nx))
    dark_d = da.from_array(dark.astype(np.float32), chunks=(ny, nx))
    projections = da.blockwise(normalise, "ijk", raw, "ijk", flat_d, "jk", dark_d, "jk",
                               eps=eps, dtype=np.float32,
                               meta=np.empty((0, 0, 0), np.float32))
    layout_attrs: dict[str, Any] = {"geometry": geometry,
                                    "detector_pixel_size": _pixel(detector_pixel_size)}
    if source_distance is not None:
        layout_attrs["source_distance"] = float(source_distance)
    if detector_distance is not None:
        layout_attrs["detector_distance"] = float(detector_distance)
    layout_attrs.update(attrs or {})
    ds = frames_dataset(projections, "projections", f"{path}:{reader.dataset}",
                        dims=("view", "v", "u"), attrs=layout_attrs,
                        arrays={"angles": radians})
    ds["projections"].attrs.update(raw_dtype=reader.dtype.name, normalisation=(
        "-log((raw - dark) / (flat - dark))"))
    return ds


def read_beamline_source(
    source: str | PathLike[str],
    *,
    format: str = "auto",
    layout: str | None = None,
    dataset: str | None = None,
    flats: str | None = None,
    darks: str | None = None,
    angles: str | None = None,
    angles_unit: str | None = None,
    attrs: Mapping[str, Any] | None = None,
    frames_per_chunk: int | None = None,
    **refused: Any,
) -> tuple[xr.Dataset, str]:
    """``source`` (a raw HDF5 scan) as a validated, lazy ``projections`` dataset.

    The reader of ``outcore convert --beamline``: internal paths default to Data Exchange's
    (:data:`DXCHANGE`; ``darks="none"`` for a scan without darks), ``angles_unit`` is
    ``deg`` (default) or ``rad``, and ``attrs`` (strings parsed as by ``--attr``) give the
    geometry: ``detector_pixel_size`` (required), ``geometry`` (default ``parallel``),
    ``source_distance`` and ``detector_distance`` (cone), and any other attr such as
    ``detector_offset`` or ``voxel_size``. ``refused`` holds the other convert options
    (``hdu``, ``dims``, ``arrays``, ``dtype``, ``shape``): any given raises ``LayoutError``. Reads
    metadata, the angles and the flats and darks (averaged), never the frames.
    """
    fmt = detect_format(source) if format == "auto" else format
    if fmt != "hdf5":
        raise LayoutError(f"--beamline reads HDF5 files; {str(source)!r} is read as {fmt}.",
                          "point at the scan's HDF5 file, or pass --format hdf5 if its suffix "
                          "is not .h5, .hdf5, .hdf, .nxs or .nx5.")
    if layout not in (None, "projections"):
        raise LayoutError(f"--beamline makes the projections layout, not {layout!r}.",
                          "drop --layout (or pass --layout projections).")
    flags = {"hdu": "--hdu", "dims": "--dims", "arrays": "--array", "dtype": "--dtype",
             "shape": "--shape"}
    for name, value in refused.items():
        if value not in (None, [], {}):
            flag = flags.get(name, f"{name}=")
            raise LayoutError(
                f"{flag} does not apply to --beamline (the raw scan's paths are --dataset, "
                "--flats, --darks and --angles).", f"drop {flag}.")
    units = {"deg": "degree", "degree": "degree", "rad": "radian", "radian": "radian"}
    unit = units.get(angles_unit or "deg")
    if unit is None:
        raise LayoutError(f"--angles-unit {angles_unit!r} is not a unit of angle.",
                          "pass --angles-unit deg or --angles-unit rad.")
    given = parse_attrs(attrs or {})
    geometry = {key: given.pop(key) for key in GEOMETRY_ATTRS if key in given}
    kind = geometry.get("geometry", "parallel")
    missing = [key for key in ("source_distance", "detector_distance") if key not in geometry]
    if kind == "cone" and missing:
        raise LayoutError(
            f"A cone-beam scan needs source_distance and detector_distance (m, from the "
            f"rotation axis); {' and '.join(missing)} not given.",
            "pass them with --attr source_distance=M --attr detector_distance=M "
            "(attrs= in Python).")
    for key in ("source_distance", "detector_distance"):
        if key in geometry and (isinstance(geometry[key], bool)
                                or not isinstance(geometry[key], int | float)):
            raise LayoutError(f"{key}={geometry[key]!r} is not a length.",
                              f"pass --attr {key}= a number of metres.")
    darks = darks or DXCHANGE["darks"]
    ds = read_beamline_hdf5(
        source, data=dataset or DXCHANGE["data"], flats=flats or DXCHANGE["flats"],
        darks=None if darks.lower() == "none" else darks, angles=angles or DXCHANGE["angles"],
        angles_unit=unit, geometry=geometry.pop("geometry", kind),
        attrs=given, frames_per_chunk=frames_per_chunk, **geometry,
    )
    return ds, validate(ds, "projections")


def memory_model(ds: xr.Dataset) -> list[TaskMemory]:
    """The task of a beamline import: read a block of raw frames and normalise it.

    Holds the raw block (its own dtype, ``raw_dtype``), its float32 copy and the float32
    output, plus :data:`NORMALISE_SCRATCH_BLOCKS` float32 blocks of scratch.
    """
    data = ds["projections"].data
    frames = max(data.chunks[0])
    block = frames * math.prod(data.shape[1:])
    raw = np.dtype(ds["projections"].attrs.get("raw_dtype", "float64")).itemsize
    return [TaskMemory("read-and-normalise", tasks=len(data.chunks[0]),
                       input_bytes=block * (raw + 4), output_bytes=block * 4,
                       transient_bytes=NORMALISE_SCRATCH_BLOCKS * block * 4,
                       read_bytes=block * raw, write_bytes=block * 4)]


def _pixel(value: float | Sequence[float]) -> float | list[float]:
    values = np.atleast_1d(np.asarray(value, dtype=np.float64)).ravel()
    if values.size not in (1, 2) or not np.isfinite(values).all() or (values <= 0).any():
        raise LayoutError(f"detector_pixel_size={value!r} is not one or two positive lengths.",
                          "pass detector_pixel_size=du or [dv, du] (positive, in metres).")
    return float(values[0]) if values.size == 1 else [float(v) for v in values]


def _named(f: Any, name: str, role: str, path: Any, h5py: Any) -> Any:
    """The dataset at ``name`` for ``role`` (data, flats, darks, angles), or a LayoutError
    that lists the file's datasets and names the keyword (and CLI option) to fix."""
    try:
        return _dataset(f, name, path, h5py)
    except LayoutError as err:
        flag = "--dataset" if role == "data" else f"--{role}"
        raise LayoutError(
            f"The {role} of the scan: {err.problem}",
            f"pass {role}= one of those internal paths (outcore convert --beamline: "
            f"{flag} PATH)" + (", or darks=None (--darks none) for a scan without darks."
                               if role == "darks" else "."),
        ) from None


def _average(f: Any, name: str, what: str, frame: tuple[int, ...], path: Any,
             h5py: Any) -> np.ndarray:
    """The mean frame (float64) of the flats or darks at ``name``, read a frame at a time."""
    node = _named(f, name, what, path, h5py)
    if node.ndim == 2:
        node_frame, count = tuple(node.shape), 1
    elif node.ndim == 3:
        node_frame, count = tuple(node.shape[1:]), node.shape[0]
    else:
        node_frame, count = tuple(node.shape), 0
    if node_frame != frame or count == 0:
        raise LayoutError(
            f"{what} {name!r} has shape {node.shape}; the raw frames are {frame} "
            f"(v, u), so {what} must be {frame} or (n, {frame[0]}, {frame[1]}) with n >= 1.",
            f"point {what}= at the {what} of this scan (same detector region and binning).",
        )
    if node.ndim == 2:
        return np.asarray(node[()], np.float64)
    total = np.zeros(frame, np.float64)
    step = max(1, (64 << 20) // max(1, math.prod(frame) * node.dtype.itemsize))
    for start in range(0, count, step):
        total += np.asarray(node[start:start + step], np.float64).sum(axis=0)
    return total / count
