"""FITS importer: an image cube (or one 2-D image) of one HDU, or a sequence of 2-D FITS
images (a directory or a glob, one frame a file), read with astropy per block."""

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
    sequence_files,
)

SUFFIXES = (".fits", ".fit", ".fts")


@dataclass
class FitsFrames(FrameReader):
    """Frames (the slowest axis in numpy order) of HDU number ``hdu`` of the file ``path``.

    Reads through ``hdu.section``, so only the frames asked for are read (and scaled by
    BSCALE/BZERO); tile-compressed HDUs work the same way. The file is opened without a
    memory map: astropy refuses to scale a memory-mapped image (16-bit counts are stored as
    int16 with BZERO 32768, so every unsigned camera frame would fail), and ``section``
    seeks to the frames either way. A 2-D image
    is one frame.
    """

    path: str
    hdu: int

    def read(self, start: int, stop: int) -> np.ndarray:
        fits = require("astropy.io.fits")
        with fits.open(self.path, memmap=False) as hdul:
            section = hdul[self.hdu].section
            return section[start:stop] if len(hdul[self.hdu].shape) > 2 else section[:, :]


@dataclass
class FitsFiles(FrameReader):
    """A sequence of 2-D FITS images; file ``i`` (its HDU ``hdus[i]``) is frame ``i``."""

    paths: tuple[str, ...]
    hdus: tuple[int, ...]

    def read(self, start: int, stop: int) -> np.ndarray:
        fits = require("astropy.io.fits")
        frames = []
        for path, index in zip(self.paths[start:stop], self.hdus[start:stop], strict=True):
            with fits.open(path, memmap=False) as hdul:
                frames.append(hdul[index].section[:, :])
        return np.stack(frames) if frames else np.empty((0, *self.shape[1:]), self.dtype)

    def source(self, start: int, stop: int) -> str:
        files = self.paths[start:stop] or self.paths[-1:]
        return f"the files {files[0]!r} to {files[-1]!r}"


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
    """Lazy dataset of ``layout`` over a FITS image HDU, or over a sequence of 2-D FITS
    images (``path`` a directory of ``.fits`` files or a glob; natural order, one frame a
    file, every file checked from its header before anything is read).

    ``hdu`` is an HDU index or EXTNAME; by default the first HDU with 2 or more axes (of a
    sequence: with 2 axes). Blocks hold ``frames_per_chunk`` frames (default: ~64 MiB).
    """
    fits = require("astropy.io.fits")
    files = sequence_files(path, SUFFIXES, "FITS")
    if len(files) > 1:
        reader = fits_series(files, hdu)
        return frames_dataset(reader.to_dask(frames_per_chunk), layout, str(path), dims=dims,
                              attrs=attrs, arrays=arrays)
    path = existing_path(files[0], "FITS file")
    with reading(f"the FITS file {str(path)!r}", REWRITE_FIX), \
            fits.open(path, memmap=False) as hdul:
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
IMPORTER = Importer("fits", SUFFIXES, ("hdu", "dims", "arrays", "frames_per_chunk"), read_fits,
                    sequence=True)


def fits_series(files: Sequence[str], hdu: int | str | None) -> FitsFiles:
    """The reader of a sequence of 2-D FITS images, once every file's image HDU has the
    first file's shape and dtype; LayoutError naming the first file that differs. Reads each
    file's header (and one row, for the dtype astropy gives after BSCALE/BZERO)."""
    fits = require("astropy.io.fits")
    found = []
    for path in files:
        with reading(f"the FITS file {path!r}", REWRITE_FIX), \
                fits.open(path, memmap=False) as hdul:
            index = hdu_index(hdul, hdu, path, axes=2)
            _refuse_truncated(hdul[index], index, path, fits)
            image = hdul[index]
            found.append((index, tuple(image.shape), native(image.section[0:1, :].dtype)))
    _, shape, dtype = found[0]
    for path, (_, other, other_dtype) in zip(files, found, strict=True):
        if other != shape or other_dtype != dtype:
            raise LayoutError(
                f"The FITS file {path!r} holds a {' x '.join(map(str, other))} {other_dtype}"
                f" image, the sequence's first file {files[0]!r} a"
                f" {' x '.join(map(str, shape))} {dtype} one: every file of a sequence must"
                " hold one image of the same shape and dtype.",
                "remove that file from the sequence (or re-export it like the others), or"
                " give a glob that matches only the sequence's images.")
    return FitsFiles((len(files), *shape), dtype, tuple(files),
                     tuple(index for index, _, _ in found))


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
