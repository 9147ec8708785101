"""Raw beamline scans in HDF5: frames, flats, darks and angles -> the ``projections`` layout.

The common layout (Data Exchange, as written by many synchrotron beamlines and read by tomopy)
holds the raw detector frames ``/exchange/data (view, v, u)``, the open-beam frames
``/exchange/data_white`` (flats), the closed-shutter frames ``/exchange/data_dark`` (darks) and
the rotation angles ``/exchange/theta`` (degrees). :func:`read_beamline_hdf5` streams the raw
frames block by block (``outcore.io.importers.hdf5.HDF5Frames``: a task opens the file, reads
its frames and closes it), averages the flats and darks once (they are small) and applies
``outcore.tomo.raw.normalise.normalise`` to each block lazily::

    projections = -log(clip((raw - dark) / (flat - dark), eps, None))    # float32

so the result is a lazy dataset of the ``projections`` layout that ``outcore.save`` writes
chunk by chunk and ``outcore.tomo`` reconstructs, without the stack ever being in memory.
:func:`read_nxtomo` does the same for an NXtomo entry (``outcore.tomo.raw.nxtomo``).
``outcore.tomo.raw.source.read_raw`` (through ``raw.registry``) is the reader behind ``outcore tomo
convert``: it refuses the options that do not apply, takes the geometry from ``--attr`` and
validates the result against the layout, all before any frame is read.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from os import PathLike
from typing import Any, Literal

import numpy as np
import xarray as xr

from outcore.checks import existing_path
from outcore.errors import LayoutError
from outcore.io.importers import FrameReader, native, require
from outcore.io.importers.hdf5 import DANGLING_FIX, HDF5Frames, _dataset
from outcore.tomo.layouts import PIXEL_UNIT
from outcore.tomo.raw import angles as angle_file
from outcore.tomo.raw import nxtomo
from outcore.tomo.raw.normalise import EPS, normalised

#: The Data Exchange paths read when none are given (``outcore tomo convert``).
DXCHANGE = {"data": "/exchange/data", "flats": "/exchange/data_white",
            "darks": "/exchange/data_dark", "angles": "/exchange/theta"}

#: Attrs of the projections layout that ``read_beamline_hdf5`` takes as keywords.
GEOMETRY_ATTRS = ("geometry", "detector_pixel_size", "source_distance", "detector_distance")


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
    layout_attrs = scan_attrs(geometry, detector_pixel_size, source_distance,
                              detector_distance, attrs)
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
        theta = (angle_file.read_file(angles) if angle_file.is_file_name(angles) else
                 np.asarray(_named(f, angles, "angles", path, h5py)[()],
                            dtype=np.float64).reshape(-1))
    return one_flat_normalised(
        reader, flat, dark, theta, angles_unit, layout_attrs, angles=angles, frames=data,
        count_fix="point angles= at the rotation angle of each frame (one per frame), or data="
                  " at the matching stack.", eps=eps, frames_per_chunk=frames_per_chunk)


def one_flat_normalised(reader: FrameReader, flat: np.ndarray, dark: np.ndarray,
                        theta: np.ndarray, angles_unit: str, layout_attrs: dict[str, Any], *,
                        angles: str, frames: str, count_fix: str, eps: float,
                        frames_per_chunk: int | None, source: str | None = None
                        ) -> xr.Dataset:
    """The lazy ``projections`` of the frames of ``reader`` normalised by one (averaged)
    ``flat`` and ``dark`` ``(v, u)``, at ``theta`` in ``angles_unit``, once the angles are
    one per frame and finite (LayoutError naming ``angles`` and ``frames`` otherwise, with
    ``count_fix`` for a count that differs): a Data Exchange or a TIFF scan."""
    n_views = reader.shape[0]
    if theta.size != n_views:
        raise LayoutError(f"{angles!r} holds {theta.size} angles but {frames!r} holds"
                          f" {n_views} frames.", count_fix)
    if not np.isfinite(theta).all():
        raise LayoutError(f"{angles!r} holds non-finite angles.",
                          "repair the angles, or give others (angles=).")
    radians = np.deg2rad(theta) if angles_unit == "degree" else theta
    ones = np.ones((n_views, 1))
    return normalised(reader, flat[None], ones, dark[None], ones, radians, layout_attrs,
                      eps=eps, frames_per_chunk=frames_per_chunk, flat_mode="mean",
                      source=source)


def scan_attrs(geometry: str, detector_pixel_size: Any, source_distance: Any,
               detector_distance: Any, attrs: Mapping[str, Any] | None) -> dict[str, Any]:
    """The layout's attrs of a raw scan, refusing a cone without its pixel size and
    distances, and distances that are not numbers. A parallel-beam scan that gives no pixel
    size is measured in pixels (``length_unit: pixel``, a pixel of 1): its centre and
    reconstruction need no length, and what does (phase retrieval) asks for the size."""
    if detector_pixel_size is None and geometry == "cone":
        raise LayoutError(
            "A cone-beam scan needs the detector pixel size (its distances are lengths), "
            "which this raw scan does not give.",
            "pass attrs={'detector_pixel_size': 7.5e-5}: the pixel pitch in metres, one"
            " number or [dv, du].",
        )
    layout_attrs: dict[str, Any] = {"geometry": geometry}
    if detector_pixel_size is None:
        layout_attrs.update(detector_pixel_size=1.0, length_unit=PIXEL_UNIT)
    else:
        layout_attrs["detector_pixel_size"] = _pixel(detector_pixel_size)
    distances = {"source_distance": source_distance, "detector_distance": detector_distance}
    missing = [key for key, value in distances.items() if value is None]
    if geometry == "cone" and missing:
        raise LayoutError(
            f"A cone-beam scan needs source_distance and detector_distance (m, from the "
            f"rotation axis); {' and '.join(missing)} not given.",
            "pass them in metres: attrs={'source_distance': M, 'detector_distance': M}.")
    for key, value in distances.items():
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise LayoutError(f"{key}={value!r} is not a length.",
                              f"pass attrs={{{key!r}: M}}, a number of metres.")
        layout_attrs[key] = float(value)
    layout_attrs.update(attrs or {})
    return layout_attrs


def read_nxtomo(
    path: str | PathLike[str],
    *,
    dataset: str | None = None,
    angles: str | None = None,
    angles_unit: Literal["degree", "radian"] | None = None,
    image_key: str | None = None,
    darks: bool = True,
    flat_mode: str = "mean",
    geometry: str = "parallel",
    detector_pixel_size: float | Sequence[float] | None = None,
    source_distance: float | None = None,
    detector_distance: float | None = None,
    attrs: Mapping[str, Any] | None = None,
    eps: float = EPS,
    frames_per_chunk: int | None = None,
) -> xr.Dataset:
    """The ``projections`` dataset of an NXtomo scan, normalised lazily block by block.

    The frames of one dataset are told apart by ``image_key`` (``outcore.tomo.raw.nxtomo``):
    projections (0) are read block by block, each block only its own frames; flats (1) and
    darks (2) are averaged per group when the dataset is made; invalid frames (3) are
    skipped. ``flat_mode`` (``mean``, ``nearest``, ``linear``) says how the groups make the
    flat and dark of each projection (``linear``: interpolated in time, by frame index,
    between the groups around it). ``dataset`` picks the frames when the file holds several
    entries; ``angles`` another angle dataset (per frame or per projection), or a file of
    them; ``image_key`` the keys' path where the entry does not hold them; ``darks=False``
    takes the dark as zero. The pixel size, the detector's distance (``propagation_distance``
    for parallel beam, ``detector_distance`` for cone) and the energy (``energy_kev``) come
    from the file unless given here or in ``attrs``. Raises ``LayoutError`` naming the fix.
    """
    path = existing_path(path, "HDF5 file")
    require("h5py")
    if flat_mode not in nxtomo.FLAT_MODES:
        raise LayoutError(f"flat_mode={flat_mode!r} is not one of {nxtomo.FLAT_MODES}.",
                          "pass flat_mode='mean', 'nearest' or 'linear'.")
    scan = nxtomo.read_scan(path, dataset=dataset, angles=angles, angles_unit=angles_unit,
                            darks=darks, flat_mode=flat_mode, image_key=image_key)
    found = dict(scan.found)
    given = dict(attrs or {})
    distance = found.pop("detector_distance", None)
    if geometry == "cone":
        detector_distance = detector_distance if detector_distance is not None else distance
        source_distance = (source_distance if source_distance is not None
                           else found.pop("source_distance", None))
    elif distance is not None:
        given.setdefault("propagation_distance", distance)
    found.pop("source_distance", None)
    if "energy_kev" in found:
        given.setdefault("energy_kev", found.pop("energy_kev"))
    pixel = detector_pixel_size if detector_pixel_size is not None else found.get(
        "detector_pixel_size")
    layout_attrs = scan_attrs(geometry, pixel, source_distance, detector_distance, given)
    radians = np.deg2rad(scan.angles) if scan.angle_unit == "degree" else scan.angles
    return normalised(scan.reader, scan.flats, scan.flat_weights, scan.darks,
                       scan.dark_weights, radians, layout_attrs, eps=eps,
                       frames_per_chunk=frames_per_chunk, flat_mode=flat_mode,
                       counts=scan.counts)


def _pixel(value: float | Sequence[float]) -> float | list[float]:
    values = np.atleast_1d(np.asarray(value, dtype=np.float64)).ravel()
    if values.size not in (1, 2) or not np.isfinite(values).all() or (values <= 0).any():
        raise LayoutError(f"detector_pixel_size={value!r} is not one or two positive lengths.",
                          "pass detector_pixel_size=du or [dv, du] (positive, in metres).")
    return float(values[0]) if values.size == 1 else [float(v) for v in values]


def _named(f: Any, name: str, role: str, path: Any, h5py: Any) -> Any:
    """The dataset at ``name`` for ``role`` (data, flats, darks, angles), or a LayoutError
    that lists the file's datasets and names the keyword to fix."""
    try:
        return _dataset(f, name, path, h5py)
    except LayoutError as err:
        keyword = "dataset=" if role == "data" else f"{role}="
        raise LayoutError(
            f"The {role} of the scan: {err.problem}",
            err.fix if err.fix == DANGLING_FIX else
            f"pass {keyword} one of those internal paths"
            + (", or darks='none' for a scan without darks." if role == "darks" else "."),
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
