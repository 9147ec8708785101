"""The kinds of raw scan, one record each: Data Exchange and NXtomo HDF5 files, TIFF frames.

A :class:`RawFormat` names its kind, the container it lives in (``hdf5`` or ``tiff``, as
``outcore.io.convert.detect_format`` tells them), the keywords of ``outcore.tomo.open_scan``
it reads (any other given is refused, naming the kinds that take it), how it claims a source
among those of its container, and its reader. ``RAW_FORMATS`` lists them in the order they
are tried; adding a kind of raw scan is its reader and one record here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from os import PathLike
from typing import Any

import xarray as xr

from outcore.errors import LayoutError, reading
from outcore.io.importers import REWRITE_FIX, require
from outcore.tomo.raw import beamline, nxtomo, tiffscan

__all__ = ["DXCHANGE", "NXTOMO", "OPTIONS", "RAW_FORMATS", "TIFF", "RawFormat", "no_darks"]

Source = str | PathLike[str]

#: Every keyword of a raw scan's reading (``open_scan``); each format reads some of them.
OPTIONS = ("dataset", "flats", "darks", "angles", "angle_unit", "image_key", "flat_mode")


@dataclass(frozen=True)
class RawFormat:
    """A kind of raw scan: ``name`` (``format=``), what it is called in messages, its
    ``container`` format, the ``options`` it reads, ``claims(source, options)`` whether a
    source of its container is one, and ``read(source, geometry, attrs, frames_per_chunk,
    **options)`` (the geometry keywords and the other attrs of ``attrs=``; only the options
    given) -> the lazy ``projections`` dataset."""

    name: str
    what: str
    container: str
    options: tuple[str, ...]
    read: Callable[..., xr.Dataset]
    claims: Callable[[Source, Mapping[str, Any]], bool] = lambda source, options: True


def no_darks(darks: Any) -> bool:
    """Whether ``darks`` says the scan has none (``'none'``: the dark is taken as zero)."""
    return isinstance(darks, str) and darks.lower() == "none"


def _refuse_other_flat_modes(flat_mode: str | None, what: str) -> None:
    if flat_mode not in (None, "mean"):
        raise LayoutError(
            f"flat_mode={flat_mode!r} needs the time of each flat, which a {what} scan's"
            " separate flats do not record.",
            "drop flat_mode= (the flats are averaged), or read an NXtomo file.")


def _read_dxchange(source: Source, geometry: dict[str, Any], attrs: dict[str, Any],
                   frames_per_chunk: int | None, *, dataset: str | None = None,
                   flats: str | None = None, darks: str | None = None,
                   angles: str | None = None, angle_unit: str | None = None,
                   flat_mode: str | None = None) -> xr.Dataset:
    _refuse_other_flat_modes(flat_mode, "Data Exchange")
    dx = beamline.DXCHANGE
    return beamline.read_beamline_hdf5(
        source, data=dataset or dx["data"], flats=flats or dx["flats"],
        darks=None if no_darks(darks) else darks or dx["darks"], angles=angles or dx["angles"],
        angles_unit=angle_unit or "degree", attrs=attrs, frames_per_chunk=frames_per_chunk,
        **geometry)


def _read_nxtomo(source: Source, geometry: dict[str, Any], attrs: dict[str, Any],
                 frames_per_chunk: int | None, *, dataset: str | None = None,
                 flats: str | None = None, darks: str | None = None,
                 angles: str | None = None, angle_unit: str | None = None,
                 image_key: str | None = None, flat_mode: str | None = None) -> xr.Dataset:
    for name, value in (("flats", flats), ("darks", None if no_darks(darks) else darks)):
        if value is not None:
            raise LayoutError(
                f"{name}={value!r} names a dataset of separate frames, but {str(source)!r} is"
                " NXtomo: its flats and darks are the frames with image_key 1 and 2.",
                f"drop {name}= (darks='none' still takes the dark as zero).")
    if flat_mode is not None and flat_mode not in nxtomo.FLAT_MODES:
        raise LayoutError(f"flat_mode={flat_mode!r} is not one of {nxtomo.FLAT_MODES}.",
                          "pass flat_mode='mean', 'nearest' or 'linear'.")
    return beamline.read_nxtomo(source, dataset=dataset, angles=angles, angles_unit=angle_unit,
                                image_key=image_key, darks=not no_darks(darks),
                                flat_mode=flat_mode or "mean", attrs=attrs,
                                frames_per_chunk=frames_per_chunk, **geometry)


def _is_nxtomo(source: Source, options: Mapping[str, Any]) -> bool:
    """An NXtomo scan: ``image_key`` is given, or ``dataset`` has an ``image_key`` beside it
    or in its entry, or (no ``dataset``) the file has no ``/exchange/data`` and an NXtomo
    entry."""
    if options.get("image_key") is not None:
        return True
    dataset = options.get("dataset")
    h5py = require("h5py")
    with reading(f"the HDF5 file {str(source)!r}", REWRITE_FIX), h5py.File(source, "r") as f:
        if dataset is None and isinstance(f.get(beamline.DXCHANGE["data"]), h5py.Dataset):
            return False
        return nxtomo.find_entry(f, dataset, h5py) is not None


def _read_tiff(source: Source, geometry: dict[str, Any], attrs: dict[str, Any],
               frames_per_chunk: int | None, *, flats: str | None = None,
               darks: str | None = None, angles: str | None = None,
               angle_unit: str | None = None, flat_mode: str | None = None) -> xr.Dataset:
    _refuse_other_flat_modes(flat_mode, "TIFF")
    if darks is None:
        raise LayoutError(f"A TIFF scan's darks are files of their own; none given for"
                          f" {str(source)!r}.", "pass darks= the dark frames (a file, a folder"
                          " or a glob), or darks='none' for a scan without them.")
    return tiffscan.read_tiff_scan(source, flats=flats, darks=None if no_darks(darks) else darks,
                                   angles=angles, angles_unit=angle_unit or "degree",
                                   attrs=attrs, frames_per_chunk=frames_per_chunk, **geometry)


NXTOMO = RawFormat("nxtomo", "NXtomo", "hdf5",
                   ("dataset", "flats", "darks", "angles", "angle_unit", "image_key",
                    "flat_mode"),
                   _read_nxtomo, _is_nxtomo)
DXCHANGE = RawFormat("dxchange", "Data Exchange", "hdf5",
                     ("dataset", "flats", "darks", "angles", "angle_unit", "flat_mode"),
                     _read_dxchange)
TIFF = RawFormat("tiff", "TIFF", "tiff", ("flats", "darks", "angles", "angle_unit", "flat_mode"),
                 _read_tiff)

#: The kinds of raw scan, in the order they claim a source of their container.
RAW_FORMATS: tuple[RawFormat, ...] = (NXTOMO, DXCHANGE, TIFF)
