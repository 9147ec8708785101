"""TIFF importer: a multi-page TIFF (pages are frames) or a sequence of single-page TIFFs."""

from __future__ import annotations

import glob
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from os import PathLike
from typing import Any

import numpy as np
import xarray as xr

from outcore.checks import existing_path
from outcore.errors import InputNotFoundError
from outcore.io.importers import Arrays, FrameReader, frames_dataset, native, require

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
    tifffile = require("tifffile")
    files = tiff_files(path_or_glob)
    with tifffile.TiffFile(files[0]) as tif:
        page = tif.pages[0]
        frame, dtype, pages = page.shape, native(page.dtype), len(tif.pages)
    if len(files) == 1:
        reader: FrameReader = TiffPages((pages, *frame), dtype, files[0])
    else:
        reader = TiffFiles((len(files), *frame), dtype, tuple(files))
    return frames_dataset(
        reader.to_dask(frames_per_chunk), layout, str(path_or_glob),
        dims=dims, attrs=attrs, arrays=arrays,
    )


def tiff_files(path_or_glob: str | PathLike[str]) -> list[str]:
    """The TIFF files named by a path, a directory or a glob, in natural order."""
    tifffile = require("tifffile")
    text = str(path_or_glob)
    if any(char in text for char in "*?["):
        files = glob.glob(text)
    else:
        path = existing_path(text, "TIFF input")
        if not path.is_dir():
            return [str(path)]
        files = [str(p) for p in path.iterdir() if p.suffix.lower() in SUFFIXES]
    if not files:
        raise InputNotFoundError(
            f"No TIFF files match {text!r}.",
            "check the directory or glob (files must end in .tif or .tiff).",
        )
    return list(tifffile.natural_sorted(files))
