"""A raw HDF5 scan as the input of a verb: its layout detected, its reading.

``outcore tomo convert`` and ``outcore tomo reconstruct --input SCAN.h5`` read raw scans with
one function, :func:`read_beamline_source`, which tells the two layouts apart: Data Exchange
(separate ``/exchange/data``, ``data_white``, ``data_dark``, ``theta``;
``outcore.tomo.raw.beamline.read_beamline_hdf5``) and NXtomo (one stack of frames told apart
by ``image_key``; ``outcore.tomo.raw.beamline.read_nxtomo``). :func:`projections_input` is
``tomo reconstruct``'s ``--input``: a projections store, or a raw scan normalised on the way
in blocks sized for the workers' memory. The options are ``outcore.tomo.raw.options``.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from os import PathLike
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from outcore import io
from outcore.checks import existing_path, key_values
from outcore.errors import LayoutError, reading
from outcore.io.convert import SUFFIXES, detect_format
from outcore.io.importers import REWRITE_FIX, is_glob, parse_attrs, require
from outcore.io.importers.tiff import tiff_files
from outcore.io.layouts import validate
from outcore.plan import Resources, TaskMemory
from outcore.tomo.layouts import PIXEL_UNIT
from outcore.tomo.memory import raw_frames_per_block
from outcore.tomo.raw import beamline, normalise, nxtomo, options, tiffscan

UNITS = {"deg": "degree", "degree": "degree", "rad": "radian", "radian": "radian"}


def scan_source(text: str | PathLike[str]) -> Path:
    """A verb's ``--input``: an existing path, made absolute, or a glob of TIFF frames kept
    as written once it matches a file (InputNotFoundError otherwise)."""
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
    flat_mode: str | None = None,
    image_key: str | None = None,
    attrs: Mapping[str, Any] | None = None,
    frames_per_chunk: int | None = None,
    notes: bool = True,
    **refused: Any,
) -> tuple[xr.Dataset, str]:
    """``source`` (a raw HDF5 scan, Data Exchange or NXtomo) as a validated, lazy
    ``projections`` dataset, and its layout name.

    The file is NXtomo when ``dataset`` (or, without it, the file's only NXtomo entry) has an
    ``image_key``; Data Exchange otherwise, with its paths by default
    (:data:`outcore.tomo.raw.beamline.DXCHANGE`; ``darks="none"``: no darks).
    ``angles_unit`` is ``deg`` or ``rad``; ``flat_mode`` ``mean`` (default), ``nearest`` or
    ``linear`` (NXtomo only); ``image_key`` the NXtomo keys' path where the entry does not
    hold them (it makes the file NXtomo). ``attrs`` (strings parsed as by ``--attr``) give or
    override the geometry: ``detector_pixel_size`` (without it and without one in the file, a
    parallel-beam scan is measured in pixels: ``length_unit`` ``pixel``), ``geometry``
    (default ``parallel``), ``source_distance`` and ``detector_distance`` (cone), and any
    other attr.
    ``notes``: print what the reader assumed (lengths in pixels, frames skipped).
    ``refused`` holds the options of other formats (``hdu``, ``dims``, ``arrays``, ``dtype``,
    ``shape``): any given raises ``LayoutError``. Reads metadata, keys, angles, flats and darks,
    never the projections.
    """
    fmt = detect_format(source) if format == "auto" else format
    if fmt not in ("hdf5", "tiff"):
        raise LayoutError(f"tomo convert reads HDF5 and TIFF scans; {str(source)!r} is read as"
                          f" {fmt}.", "point at the scan's HDF5 file or TIFF frames, or pass "
                          "--format hdf5 if its suffix is not .h5, .hdf5, .hdf, .nxs or .nx5.")
    if layout not in (None, "projections"):
        raise LayoutError(f"tomo convert makes the projections layout, not {layout!r}.",
                          "drop --layout (or pass --layout projections).")
    flags = {"hdu": "--hdu", "dims": "--dims", "arrays": "--array", "dtype": "--dtype",
             "shape": "--shape"}
    for name, value in refused.items():
        if value not in (None, [], {}):
            flag = flags.get(name, f"{name}=")
            raise LayoutError(
                f"{flag} does not apply to tomo convert (the raw scan's paths are --dataset, "
                "--flats, --darks and --angles).", f"drop {flag}.")
    unit = UNITS.get(angles_unit) if angles_unit else None
    if angles_unit and unit is None:
        raise LayoutError(f"--angles-unit {angles_unit!r} is not a unit of angle.",
                          "pass --angles-unit deg or --angles-unit rad.")
    if flat_mode is not None and flat_mode not in nxtomo.FLAT_MODES:
        raise LayoutError(f"--flat-mode {flat_mode!r} is not one of {nxtomo.FLAT_MODES}.",
                          "pass --flat-mode mean, nearest or linear.")
    extra = parse_attrs(attrs or {})
    geometry = {key: extra.pop(key) for key in beamline.GEOMETRY_ATTRS if key in extra}
    geometry.setdefault("geometry", "parallel")
    no_darks = darks is not None and darks.lower() == "none"
    if fmt == "tiff":
        for value, flag in ((dataset, "--dataset"), (image_key, "--image-key"),
                            (None if flat_mode in (None, "mean") else flat_mode, "--flat-mode")):
            if value is not None:
                raise LayoutError(f"{flag} applies to HDF5 scans; {str(source)!r} is TIFF.",
                                  f"drop {flag}.")
        if darks is None:
            raise LayoutError(f"A TIFF scan's darks are files of their own; none given for"
                              f" {str(source)!r}.", "pass --darks the dark frames (a file, a "
                              "folder or a glob), or --darks none for a scan without them.")
        ds = tiffscan.read_tiff_scan(source, flats=flats, darks=None if no_darks else darks,
                                     angles=angles, angles_unit=unit or "degree", attrs=extra,
                                     frames_per_chunk=frames_per_chunk, **geometry)
    elif image_key is not None or _is_nxtomo(source, dataset):
        for value, flag in ((flats, "--flats"), (None if no_darks else darks, "--darks")):
            if value is not None:
                raise LayoutError(
                    f"{flag} names a dataset of separate frames, but {str(source)!r} is "
                    "NXtomo: its flats and darks are the frames with image_key 1 and 2.",
                    f"drop {flag} (--darks none still takes the dark as zero).")
        ds = beamline.read_nxtomo(source, dataset=dataset, angles=angles, angles_unit=unit,
                                  image_key=image_key, darks=not no_darks,
                                  flat_mode=flat_mode or "mean", attrs=extra,
                                  frames_per_chunk=frames_per_chunk, **geometry)
        invalid = ds["projections"].attrs["frames"]["invalid"]
        if invalid and notes:
            print(f"note: {invalid} frames of {str(source)!r} have image_key 3 (invalid) "
                  "and are skipped", file=sys.stderr)
    else:
        if flat_mode not in (None, "mean"):
            raise LayoutError(
                f"--flat-mode {flat_mode} needs the time of each flat, which a Data Exchange "
                "file's separate flats do not record.",
                "drop --flat-mode (the flats are averaged), or convert an NXtomo file.")
        dx = beamline.DXCHANGE
        ds = beamline.read_beamline_hdf5(
            source, data=dataset or dx["data"], flats=flats or dx["flats"],
            darks=None if no_darks else darks or dx["darks"], angles=angles or dx["angles"],
            angles_unit=unit or "degree", attrs=extra, frames_per_chunk=frames_per_chunk,
            **geometry)
    if ds.attrs.get("length_unit") == PIXEL_UNIT and notes:
        print(f"note: {str(source)!r} gives no pixel size: lengths are in detector pixels (the"
              " volume in attenuation per pixel); --attr detector_pixel_size=M gives metres",
              flush=True)
    return ds, validate(ds, "projections")


def _is_nxtomo(source: str | PathLike[str], dataset: str | None) -> bool:
    """Whether the scan is NXtomo: ``dataset`` has an ``image_key`` beside it or in its
    entry, or (no ``dataset``) the file has no ``/exchange/data`` and an NXtomo entry."""
    h5py = require("h5py")
    with reading(f"the HDF5 file {str(source)!r}", REWRITE_FIX), h5py.File(source, "r") as f:
        if dataset is None and isinstance(f.get(beamline.DXCHANGE["data"]), h5py.Dataset):
            return False
        return nxtomo.find_entry(f, dataset, h5py) is not None


def projections_input(source: Path, given: Mapping[str, Any], resources: Resources
                      ) -> tuple[xr.Dataset, list[TaskMemory], dict[str, Any] | None]:
    """The projections of ``tomo reconstruct --input``, the plan stages of reading them, and
    the raw-scan options ``given`` (``options.given``): a store opened as it is (its raw-scan
    options refused), or a raw HDF5 scan normalised lazily, in blocks sized for the workers'
    memory (``raw_frames_per_block``) unless ``--frames-per-chunk`` is given."""
    if not is_raw_scan(source):
        options.refuse(given, f"{str(source)!r} is a projections store",
                       "drop {flag}, or pass --input the raw HDF5 scan.")
        return io.open(source, layout="projections"), [], None
    attrs = given.get("attr")
    read = {**given, "attrs": key_values(attrs, "--attr") if attrs else None}
    read.pop("attr", None)
    ds, _ = read_beamline_source(source, **read)
    if "frames_per_chunk" not in given:  # blocks sized for the workers' memory
        data = ds["projections"]
        frames = raw_frames_per_block(resources, data.shape[1] * data.shape[2],
                                      np.dtype(data.attrs.get("raw_dtype", "float32")).itemsize)
        if frames < max(data.chunks[0]):
            ds, _ = read_beamline_source(source, **read, frames_per_chunk=frames,
                                         notes=False)  # said on the first read
    return ds, normalise.memory_model(ds), dict(given)
