"""A raw scan read: its kind found in the registry, its options checked, its frames
normalised lazily in blocks sized for the workers.

``outcore.tomo.open_scan``, ``outcore tomo convert`` and a raw scan given to ``tomo
reconstruct`` or ``tomo center`` read raw scans with :func:`read_scan`: the kind of scan is
the first record of ``outcore.tomo.raw.registry.RAW_FORMATS`` that claims it (Data Exchange,
NXtomo, TIFF frames), the options it does not read are refused, ``attrs`` give or override
the geometry, and the frames are read in blocks that fit the workers' memory
(``memory.raw_frames_per_block``) unless ``frames_per_chunk`` says otherwise.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from os import PathLike
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from outcore.checks import existing_path
from outcore.errors import LayoutError
from outcore.io.convert import SUFFIXES, detect_format
from outcore.io.importers import is_glob, parse_attrs
from outcore.io.importers.tiff import tiff_files
from outcore.io.layouts import validate
from outcore.plan import Resources, TaskMemory
from outcore.tomo.layouts import PIXEL_UNIT
from outcore.tomo.memory import raw_frames_per_block
from outcore.tomo.raw import beamline, normalise
from outcore.tomo.raw.registry import OPTIONS, RAW_FORMATS, RawFormat

__all__ = ["FORMATS", "UNITS", "is_raw_scan", "raw_format", "read_raw", "read_scan",
           "scan_source"]

#: ``format=`` of a raw scan: auto, a container (``hdf5``, ``tiff``) or a kind of scan.
FORMATS: tuple[str, ...] = ("auto", "hdf5", "tiff", *(f.name for f in RAW_FORMATS))
#: Units of ``angle_unit=`` and what the readers call them.
UNITS = {"deg": "degree", "degree": "degree", "degrees": "degree", "rad": "radian",
         "radian": "radian", "radians": "radian"}


def scan_source(text: str | PathLike[str]) -> Path:
    """A scan's path: an existing path, made absolute, or a glob of TIFF frames kept as
    written once it matches a file (InputNotFoundError otherwise)."""
    if is_glob(text):
        tiff_files(text)
        return Path(text)
    return existing_path(text, "input").resolve()


def is_raw_scan(path: str | PathLike[str]) -> bool:
    """Whether ``path`` is a raw scan rather than a store: an HDF5 or TIFF file, a glob of
    TIFF frames, or a folder of them."""
    if is_glob(path):
        return True
    path = Path(path)
    if path.is_dir():
        return detect_format(path) == "tiff"
    return path.is_file() and SUFFIXES.get(path.suffix.lower()) in ("hdf5", "tiff")


def raw_format(source: str | PathLike[str], format: str, options: Mapping[str, Any]  # noqa: A002
               ) -> RawFormat:
    """The record of ``source``'s kind of scan: the one ``format`` names, else the first of
    its container (``format``, or the one its suffix says) that claims it."""
    if format not in FORMATS:
        raise LayoutError(f"format={format!r} is not one of {', '.join(FORMATS)}.",
                          "pass format='auto' (from the suffix), 'hdf5', 'tiff', or the kind"
                          " of scan ('dxchange', 'nxtomo').")
    named = [f for f in RAW_FORMATS if f.name == format]
    if named:
        return named[0]
    container = detect_format(source) if format == "auto" else format
    for record in RAW_FORMATS:
        if record.container == container and record.claims(source, options):
            return record
    raise LayoutError(f"A raw tomography scan is an HDF5 file or TIFF frames; {str(source)!r}"
                      f" reads as {container}.", "point at the scan's HDF5 file or TIFF"
                      " frames, or pass format='hdf5' if its suffix is not .h5, .hdf5, .hdf,"
                      " .nxs or .nx5.")


def read_raw(source: str | PathLike[str], *, format: str = "auto",  # noqa: A002
             options: Mapping[str, Any] | None = None, attrs: Mapping[str, Any] | None = None,
             frames_per_chunk: int | None = None, notes: bool = True) -> xr.Dataset:
    """``source`` as a validated, lazy ``projections`` dataset, its frames read in blocks of
    ``frames_per_chunk`` (default ~64 MiB).

    ``options`` (keywords of ``OPTIONS`` whose value is not None) go to the kind of scan's
    reader; one it does not read is refused with the kinds that do. ``angle_unit`` is
    ``deg`` or ``rad`` (default degrees, or NXtomo's units attr). ``attrs`` (strings parsed
    as numbers where they are) give or override the geometry: ``detector_pixel_size``
    (without it and without one in the file, a parallel-beam scan is measured in pixels:
    ``length_unit`` ``pixel``), ``geometry`` (default ``parallel``), ``source_distance`` and
    ``detector_distance`` (cone), and any other attr. ``notes``: print what the reader
    assumed (lengths in pixels, frames skipped). Reads metadata, keys, angles, flats and
    darks, never the projections."""
    given = {key: value for key, value in (options or {}).items() if value is not None}
    unknown = sorted(set(given) - set(OPTIONS))
    if unknown:
        raise LayoutError(f"{unknown[0]}= is not an option of a raw scan.",
                          f"use {', '.join(o + '=' for o in OPTIONS)}.")
    record = raw_format(source, format, given)
    for name in given:
        if name not in record.options:
            takers = " and ".join(f.what for f in RAW_FORMATS if name in f.options)
            raise LayoutError(f"{name}= applies to {takers} scans; {str(source)!r} is a"
                              f" {record.what} scan.", f"drop {name}=.")
    if "angle_unit" in given:
        unit = UNITS.get(str(given["angle_unit"]).lower())
        if unit is None:
            raise LayoutError(f"angle_unit={given['angle_unit']!r} is not a unit of angle.",
                              "pass angle_unit='degree' or angle_unit='radian'.")
        given["angle_unit"] = unit
    extra = parse_attrs(attrs or {})
    geometry = {key: extra.pop(key) for key in beamline.GEOMETRY_ATTRS if key in extra}
    geometry.setdefault("geometry", "parallel")
    ds = record.read(source, geometry, extra, frames_per_chunk, **given)
    invalid = ds["projections"].attrs.get("frames", {}).get("invalid")
    if invalid and notes:
        print(f"note: {invalid} frames of {str(source)!r} have image_key 3 (invalid) and are"
              " skipped", file=sys.stderr)
    if ds.attrs.get("length_unit") == PIXEL_UNIT and notes:
        print(f"note: {str(source)!r} gives no pixel size: lengths are in detector pixels (the"
              " volume in attenuation per pixel); a detector_pixel_size attr (metres at the"
              " sample) gives metres", flush=True)
    validate(ds, "projections")
    return ds.set_coords("angles")


def read_scan(source: str | PathLike[str], resources: Resources | None, *,
              format: str = "auto", options: Mapping[str, Any] | None = None,  # noqa: A002
              attrs: Mapping[str, Any] | None = None, frames_per_chunk: int | None = None
              ) -> tuple[xr.Dataset, list[TaskMemory]]:
    """:func:`read_raw` of ``source`` in blocks sized for ``resources``' workers
    (``raw_frames_per_block``) unless ``frames_per_chunk`` is given (or ``resources`` is
    None: ~64 MiB of frames), and the plan stage of reading and normalising it."""
    read = {"format": format, "options": options, "attrs": attrs}
    ds = read_raw(source, **read, frames_per_chunk=frames_per_chunk)
    if frames_per_chunk is None and resources is not None:
        data = ds["projections"]
        frames = raw_frames_per_block(resources, data.shape[1] * data.shape[2],
                                      np.dtype(data.attrs.get("raw_dtype", "float32")).itemsize)
        if frames < max(data.chunks[0]):
            ds = read_raw(source, **read, frames_per_chunk=frames, notes=False)  # said once
    return ds, normalise.memory_model(ds)
