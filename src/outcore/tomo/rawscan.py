"""A raw HDF5 scan as the input of a verb: its options, its layout, its reading.

``outcore convert --beamline`` and ``outcore tomo reconstruct --input SCAN.h5`` read raw scans
the same way, so their options are defined once (:func:`add_arguments`), gathered once
(:func:`given`) and read by one function, :func:`read_beamline_source`, which tells the two
layouts apart: Data Exchange (separate ``/exchange/data``, ``data_white``, ``data_dark``,
``theta``; ``outcore.tomo.beamline.read_beamline_hdf5``) and NXtomo (one stack of frames told
apart by ``image_key``; ``outcore.tomo.beamline.read_nxtomo``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from os import PathLike
from pathlib import Path
from typing import Any

import xarray as xr

from outcore.errors import LayoutError, OutcoreError, reading
from outcore.io.convert import SUFFIXES, detect_format
from outcore.io.importers import REWRITE_FIX, parse_attrs, require
from outcore.io.layouts import validate
from outcore.tomo import beamline, nxtomo

#: The options of a raw scan both verbs share (argparse destination -> flag).
SHARED = {"flats": "--flats", "darks": "--darks", "angles": "--angles",
          "angles_unit": "--angles-unit", "flat_mode": "--flat-mode"}
#: Those ``tomo reconstruct`` adds (``convert`` has them for every format).
SOURCE = {"dataset": "--dataset", "attr": "--attr", "frames_per_chunk": "--frames-per-chunk"}
UNITS = {"deg": "degree", "degree": "degree", "rad": "radian", "radian": "radian"}


def add_arguments(group: argparse._ArgumentGroup, *, source_options: bool) -> None:
    """The options of a raw scan, in ``group``; ``source_options`` adds ``--dataset`` and
    ``--attr`` (``convert`` has its own). None has a default, so :func:`given` tells the
    options typed from the others."""
    if source_options:
        group.add_argument("--dataset", default=argparse.SUPPRESS, metavar="PATH",
                           help="HDF5 path of the raw frames (default /exchange/data, or the "
                                "NXtomo entry's detector data)")
        group.add_argument("--attr", action="append", default=argparse.SUPPRESS,
                           metavar="KEY=VALUE",
                           help="geometry attr of the scan, e.g. detector_pixel_size=6.5e-7 "
                                "(repeatable)")
        group.add_argument("--frames-per-chunk", type=int, default=argparse.SUPPRESS,
                           metavar="N", help="raw frames read per task (default: as many as "
                                             "the worker memory limit leaves room for)")
    group.add_argument("--flats", default=argparse.SUPPRESS, metavar="PATH",
                       help="Data Exchange: HDF5 path of the flat (open-beam) frames "
                            "(default /exchange/data_white)")
    group.add_argument("--darks", default=argparse.SUPPRESS, metavar="PATH",
                       help="Data Exchange: HDF5 path of the dark frames (default "
                            "/exchange/data_dark); 'none' for a scan without darks (dark = 0)")
    group.add_argument("--angles", default=argparse.SUPPRESS, metavar="PATH",
                       help="HDF5 path of the rotation angles (default /exchange/theta, or "
                            "the NXtomo entry's sample/rotation_angle)")
    group.add_argument("--angles-unit", default=argparse.SUPPRESS, choices=("deg", "rad"),
                       help="unit of --angles (default deg, or NXtomo's units attr)")
    group.add_argument("--flat-mode", default=argparse.SUPPRESS, choices=nxtomo.FLAT_MODES,
                       help="NXtomo: the flat and dark of a projection from groups taken "
                            "before and after: mean of all, the nearest group in time, or "
                            "linear in time between them (default mean)")


def given(args: argparse.Namespace, *, source_options: bool) -> dict[str, Any]:
    """The raw-scan options typed in ``args`` (``{dest: value}``, those not typed left out)."""
    names = {**SHARED, **(SOURCE if source_options else {})}
    return {name: getattr(args, name) for name in names if getattr(args, name, None)}


def refuse(options: Mapping[str, Any], why: str, fix: str) -> None:
    """OutcoreError for the first raw-scan option in ``options`` (it does not apply)."""
    for name in options:
        flag = {**SHARED, **SOURCE}[name]
        raise OutcoreError(f"{flag} applies to raw beamline scans only: {why}.",
                           fix.format(flag=flag))


def is_raw_scan(path: str | PathLike[str]) -> bool:
    """Whether ``path`` is a file with an HDF5 suffix (a raw scan, not a store)."""
    path = Path(path)
    return path.is_file() and SUFFIXES.get(path.suffix.lower()) == "hdf5"


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
    attrs: Mapping[str, Any] | None = None,
    frames_per_chunk: int | None = None,
    **refused: Any,
) -> tuple[xr.Dataset, str]:
    """``source`` (a raw HDF5 scan, Data Exchange or NXtomo) as a validated, lazy
    ``projections`` dataset, and its layout name.

    The file is NXtomo when ``dataset`` (or, without it, the file's only NXtomo entry) has an
    ``image_key``; Data Exchange otherwise, with its paths by default
    (:data:`outcore.tomo.beamline.DXCHANGE`; ``darks="none"``: no darks). ``angles_unit`` is
    ``deg`` or ``rad``; ``flat_mode`` ``mean`` (default), ``nearest`` or ``linear`` (NXtomo
    only). ``attrs`` (strings parsed as by ``--attr``) give or override the geometry:
    ``detector_pixel_size`` (required unless the file has it), ``geometry`` (default
    ``parallel``), ``source_distance`` and ``detector_distance`` (cone), and any other attr.
    ``refused`` holds the other convert options (``hdu``, ``dims``, ``arrays``, ``dtype``,
    ``shape``): any given raises ``LayoutError``. Reads metadata, keys, angles, flats and darks,
    never the projections.
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
    if _is_nxtomo(source, dataset):
        for value, flag in ((flats, "--flats"), (None if no_darks else darks, "--darks")):
            if value is not None:
                raise LayoutError(
                    f"{flag} names a dataset of separate frames, but {str(source)!r} is "
                    "NXtomo: its flats and darks are the frames with image_key 1 and 2.",
                    f"drop {flag} (--darks none still takes the dark as zero).")
        ds = beamline.read_nxtomo(source, dataset=dataset, angles=angles, angles_unit=unit,
                                  darks=not no_darks, flat_mode=flat_mode or "mean",
                                  attrs=extra, frames_per_chunk=frames_per_chunk, **geometry)
        invalid = ds["projections"].attrs["frames"]["invalid"]
        if invalid:
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
    return ds, validate(ds, "projections")


def _is_nxtomo(source: str | PathLike[str], dataset: str | None) -> bool:
    """Whether the scan is NXtomo: ``dataset`` has an ``image_key`` beside it or in its
    entry, or (no ``dataset``) the file has no ``/exchange/data`` and an NXtomo entry."""
    h5py = require("h5py")
    with reading(f"the HDF5 file {str(source)!r}", REWRITE_FIX), h5py.File(source, "r") as f:
        if dataset is None and isinstance(f.get(beamline.DXCHANGE["data"]), h5py.Dataset):
            return False
        return nxtomo.find_entry(f, dataset, h5py) is not None
