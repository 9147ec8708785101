"""TIFF importer: a multi-page TIFF (pages are frames) or a sequence of single-page TIFFs."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from os import PathLike
from typing import Any

import numpy as np
import xarray as xr

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

SUFFIXES = (".tif", ".tiff")


@dataclass
class TiffPages(FrameReader):
    """Pages of one multi-page TIFF file; page ``i`` is frame ``i``."""

    path: str

    def read(self, start: int, stop: int) -> np.ndarray:
        tifffile = require("tifffile")
        with tifffile.TiffFile(self.path) as tif:
            return tif.asarray(key=range(start, stop), maxworkers=1)


@dataclass
class TiffFiles(FrameReader):
    """A sequence of single-page TIFF files; file ``i`` is frame ``i``."""

    paths: tuple[str, ...]

    def read(self, start: int, stop: int) -> np.ndarray:
        tifffile = require("tifffile")
        return tifffile.imread(list(self.paths[start:stop]), maxworkers=1)

    def source(self, start: int, stop: int) -> str:
        files = self.paths[start:stop] or self.paths[-1:]
        return f"the files {files[0]!r} to {files[-1]!r}"


def read_tiff(
    path_or_glob: str | PathLike[str],
    *,
    layout: str,
    dims: Sequence[str] | None = None,
    attrs: Mapping[str, Any] | None = None,
    arrays: Arrays | None = None,
    frames_per_chunk: int | None = None,
) -> xr.Dataset:
    """Lazy dataset of ``layout`` over TIFF frames.

    ``path_or_glob`` is a multi-page TIFF (each page a frame), a directory of ``.tif``/
    ``.tiff`` files, or a glob such as ``"scan/frame_*.tif"``; files are taken in natural
    order (``frame_2`` before ``frame_10``), one frame each. Blocks hold
    ``frames_per_chunk`` frames (default: ~64 MiB).
    """
    reader = tiff_reader(path_or_glob)
    return frames_dataset(
        reader.to_dask(frames_per_chunk), layout, str(path_or_glob),
        dims=dims, attrs=attrs, arrays=arrays,
    )


def tiff_reader(path_or_glob: str | PathLike[str]) -> FrameReader:
    """The frames of a multi-page TIFF (``TiffPages``) or of a series of single-page TIFFs
    named by a directory or a glob (``TiffFiles``, every file's header checked first by
    ``check_series``); InputDamagedError for a first file that is damaged or truncated."""
    tifffile = require("tifffile")
    files = tiff_files(path_or_glob)
    subject = f"the TIFF file {files[0]!r}"
    with reading(subject, REWRITE_FIX), _logged_errors() as logged, \
            tifffile.TiffFile(files[0]) as tif:
        page = tif.pages[0]
        frame, dtype, pages = page.shape, native(page.dtype), len(tif.pages)
        last = tif.pages[-1]
        end = max((o + n for o, n in zip(last.dataoffsets, last.databytecounts, strict=True)),
                  default=0)
        size = tif.filehandle.size
    if logged or end > size:
        why = logged[0] if logged else f"its last page's data ends at byte {end} of {size}"
        raise InputDamagedError(f"{subject[:1].upper()}{subject[1:]} is damaged or truncated"
                                f" ({why}).", REWRITE_FIX)
    if len(files) == 1:
        return TiffPages((pages, *frame), dtype, files[0])
    check_series(files, frame, dtype)
    return TiffFiles((len(files), *frame), dtype, tuple(files))


#: TIFF files, directories and globs of them in the importers' registry.
IMPORTER = Importer("tiff", SUFFIXES, ("dims", "arrays", "frames_per_chunk"), read_tiff,
                    sequence=True)


def check_series(files: Sequence[str], frame: tuple[int, ...], dtype: np.dtype) -> None:
    """Refuse a series of single-page TIFFs whose files do not all hold one ``frame``-shaped
    page of ``dtype`` (the first file's), naming the first file that differs. Reads only
    each file's header (its first page's tags)."""
    tifffile = require("tifffile")
    first = files[0]
    for path in files[1:]:
        with reading(f"the TIFF file {path!r}", REWRITE_FIX), tifffile.TiffFile(path) as tif:
            page = tif.pages[0]
            found, found_dtype, pages = page.shape, native(page.dtype), len(tif.pages)
        if found != frame or found_dtype != dtype or pages != 1:
            counted = "" if pages == 1 else f" in {pages} pages"
            raise LayoutError(
                f"The TIFF file {path!r} holds {' x '.join(map(str, found))} {found_dtype}"
                f" frames{counted}, the series' first file {first!r} one"
                f" {' x '.join(map(str, frame))} {dtype} frame: every file of a series must"
                " hold one frame of the same shape and dtype.",
                "remove that file from the series (or re-export it like the others), or"
                " give a glob that matches only the scan's frames.")


@contextlib.contextmanager
def _logged_errors() -> Iterator[list[str]]:
    """The errors tifffile logs inside the block (a page chain that points past the end of a
    truncated file, a corrupted tag list), kept off the terminal; tifffile itself goes on
    with the pages it could read."""
    found: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            found.append(record.getMessage())

    log, keep = logging.getLogger("tifffile"), Keep(logging.ERROR)
    propagate, log.propagate = log.propagate, False
    log.addHandler(keep)
    try:
        yield found
    finally:
        log.removeHandler(keep)
        log.propagate = propagate


def tiff_files(path_or_glob: str | PathLike[str]) -> list[str]:
    """The TIFF files named by a path, a directory or a glob, in natural order."""
    return sequence_files(path_or_glob, SUFFIXES, "TIFF")
