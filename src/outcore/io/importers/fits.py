"""FITS importer: an image cube (or one 2-D image) of one HDU, read with astropy per block."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from outcore.checks import existing_path
from outcore.errors import InputDamagedError, LayoutError, reading
from outcore.io.importers import (
    REWRITE_FIX,
    Arrays,
    FrameReader,
    Importer,
    frames_dataset,
    native,
    require,
)


@dataclass
class FitsFrames(FrameReader):
    """Frames (the slowest axis in numpy order) of HDU number ``hdu`` of the file ``path``.

    Reads through ``hdu.section`` on a memory-mapped file, so only the frames asked for are
    read (and scaled by BSCALE/BZERO); tile-compressed HDUs work the same way. A 2-D image
    is one frame.
    """

    path: str
    hdu: int

    def read(self, start: int, stop: int) -> np.ndarray:
        fits = require("astropy.io.fits")
        with fits.open(self.path, memmap=True) as hdul:
            section = hdul[self.hdu].section
            return section[start:stop] if len(hdul[self.hdu].shape) > 2 else section[:, :]


def read_fits(
    path: str | PathLike[str],
    *,
    layout: str,
    hdu: int | str | None = None,
    dims: Sequence[str] | None = None,
    attrs: Mapping[str, Any] | None = None,
    arrays: Arrays | None = None,
    frames_per_chunk: int | None = None,
) -> xr.Dataset:
    """Lazy dataset of ``layout`` over a FITS image HDU.

    ``hdu`` is an HDU index or EXTNAME; by default the first HDU with 2 or more axes. Blocks
    hold ``frames_per_chunk`` frames (default: ~64 MiB).
    """
    fits = require("astropy.io.fits")
    path = existing_path(path, "FITS file")
    with reading(f"the FITS file {str(path)!r}", REWRITE_FIX), \
            fits.open(path, memmap=True) as hdul:
        index = hdu_index(hdul, hdu, path)
        _refuse_truncated(hdul[index], index, path, fits)
        shape = tuple(hdul[index].shape)
        first = hdul[index].section[0:1]
    reader = FitsFrames(shape if len(shape) > 2 else (1, *shape), native(first.dtype),
                        str(path), index)
    return frames_dataset(
        reader.to_dask(frames_per_chunk), layout, f"{path}[{index}]",
        dims=dims, attrs=attrs, arrays=arrays,
    )


#: FITS images in the importers' registry.
IMPORTER = Importer("fits", (".fits", ".fit", ".fts"),
                    ("hdu", "dims", "arrays", "frames_per_chunk"), read_fits)


def _refuse_truncated(hdu: Any, index: int, path: Any, fits: Any) -> None:
    """InputDamagedError when the data of an uncompressed image HDU ends past the file's end
    (a truncated copy), which astropy would only meet when the missing frames are read."""
    if not isinstance(hdu, fits.PrimaryHDU | fits.ImageHDU):
        return
    end = hdu.fileinfo()["datLoc"] + hdu.size
    size = os.path.getsize(path)
    if end > size:
        raise InputDamagedError(
            f"The FITS file {str(path)!r} is truncated: HDU {index}'s data ends at byte {end},"
            f" the file has {size}.", REWRITE_FIX)


def hdu_index(hdul: Any, hdu: int | str | None, path: Any, *, axes: int | None = None) -> int:
    """Index of the image HDU asked for (index or EXTNAME), or of the first image HDU, with
    exactly ``axes`` axes (``None``: 2 or more); a LayoutError listing the HDUs otherwise."""
    def fits_axes(h: Any) -> bool:
        n = len(h.shape or ())
        return n == axes if axes is not None else n >= 2

    images = [i for i, h in enumerate(hdul) if h.is_image and fits_axes(h)]
    if hdu is None and images:
        return images[0]
    if hdu is not None:
        try:
            index = hdul.index_of(hdu)
        except (KeyError, IndexError):
            index = None
        if index is not None and index < len(hdul) and index in images:
            return int(index)
    listing = ", ".join(f"{i} {h.name!r} {tuple(h.shape or ())}" for i, h in enumerate(hdul))
    asked = "" if hdu is None else f" {hdu!r}"
    kind = "2 or more axes" if axes is None else f"{axes} axes"
    raise LayoutError(
        f"{Path(path).name!r} has no image HDU{asked} with {kind}; its HDUs are: {listing}.",
        f"pass hdu= the index or EXTNAME of an image HDU with {kind}.",
    )
