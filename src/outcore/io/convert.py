"""``convert``: import a file into a new outcore store, or re-lay out / re-chunk a store."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from os import PathLike
from pathlib import Path
from typing import Any

import xarray as xr

from outcore.checks import existing_path
from outcore.errors import LayoutError, refuse_existing
from outcore.io.importers import Arrays, arrange
from outcore.io.importers.fits import read_fits
from outcore.io.importers.hdf5 import read_hdf5
from outcore.io.importers.npz import read_npz
from outcore.io.importers.raw import read_npy, read_raw
from outcore.io.importers.tiff import read_tiff
from outcore.io.layouts import LAYOUT_ATTR, LAYOUTS, detect_layout, validate
from outcore.io.store import open_unchecked, save

#: Formats ``convert`` reads, by file suffix.
SUFFIXES = {
    ".h5": "hdf5", ".hdf5": "hdf5", ".hdf": "hdf5", ".nxs": "hdf5", ".nx5": "hdf5",
    ".tif": "tiff", ".tiff": "tiff",
    ".fits": "fits", ".fit": "fits", ".fts": "fits",
    ".npz": "npz",
    ".npy": "npy",
    ".raw": "raw", ".bin": "raw",
    ".zarr": "zarr",
}
FORMATS = ("hdf5", "tiff", "fits", "npz", "npy", "raw", "zarr")


def convert(
    source: str | PathLike[str],
    output: str | PathLike[str],
    *,
    format: str = "auto",
    layout: str | None = None,
    dataset: str | None = None,
    hdu: int | str | None = None,
    attrs: Mapping[str, Any] | None = None,
    dims: Sequence[str] | None = None,
    arrays: Arrays | None = None,
    chunks: Mapping[str, int] | None = None,
    frames_per_chunk: int | None = None,
    dtype: Any = None,
    shape: Sequence[int] | None = None,
) -> Path:
    """Write ``source`` as a new outcore store at ``output`` (streamed, never overwriting).

    ``format`` is one of hdf5, tiff, fits, npz, npy, raw, zarr, or ``auto`` (from the
    suffix; a directory of TIFFs or a glob is tiff). ``layout`` is required except for npz
    (cutouts) and outcore stores; a raw (headerless) file needs its ``dtype`` and
    ``shape``. ``dataset`` (HDF5 internal path) and ``hdu`` (FITS) pick the data;
    ``dims`` names its axes in stored order when the default does not fit; ``arrays`` adds
    companions such as ``angles`` or ``positions``; ``attrs`` adds root attrs, strings
    parsed (``"1e-10"`` -> 1e-10). ``chunks`` sets the output chunk size per dim and
    ``frames_per_chunk`` the read block size. Returns the output path.
    """
    output = Path(output).expanduser()
    refuse_existing(output)
    ds, layout = read_source(source, format=format, layout=layout, dataset=dataset, hdu=hdu,
                             attrs=attrs, dims=dims, arrays=arrays,
                             frames_per_chunk=frames_per_chunk, dtype=dtype, shape=shape)
    return save(ds, output, layout=layout, chunks=chunks)


def read_source(
    source: str | PathLike[str],
    *,
    format: str = "auto",
    layout: str | None = None,
    dataset: str | None = None,
    hdu: int | str | None = None,
    attrs: Mapping[str, Any] | None = None,
    dims: Sequence[str] | None = None,
    arrays: Arrays | None = None,
    frames_per_chunk: int | None = None,
    dtype: Any = None,
    shape: Sequence[int] | None = None,
) -> tuple[xr.Dataset, str]:
    """``source`` as a lazy dataset in its layout, and that layout's name (see ``convert``).

    Reads only metadata, so every error about the input comes before any data is read.
    """
    fmt = detect_format(source) if format == "auto" else format
    if fmt not in FORMATS:
        raise LayoutError(f"format={format!r} is not known.", f"use one of {FORMATS} or 'auto'.")
    _refuse_options(fmt, dataset=dataset, hdu=hdu, dims=dims, arrays=arrays,
                    frames_per_chunk=frames_per_chunk, dtype=dtype, shape=shape)
    if fmt == "npz":
        if layout not in (None, "cutouts"):
            raise LayoutError(f"An npz catalog holds cutouts, not {layout}.",
                              "leave layout out (or pass layout='cutouts').")
        return read_npz(source, attrs=attrs, frames_per_chunk=frames_per_chunk), "cutouts"
    if fmt == "zarr":
        ds = _relayout(source, layout, dims, attrs, arrays)
        return ds, validate(ds, layout)
    if layout is None:
        raise LayoutError(
            f"A {fmt} file does not say which layout it holds.",
            f"pass layout= one of {sorted(LAYOUTS)} (CLI: --layout).",
        )
    options = dict(layout=layout, dims=dims, attrs=attrs, arrays=arrays,
                   frames_per_chunk=frames_per_chunk)
    if fmt == "hdf5":
        ds = read_hdf5(source, dataset, **options)
    elif fmt == "fits":
        ds = read_fits(source, hdu=hdu, **options)
    elif fmt == "npy":
        ds = read_npy(source, **options)
    elif fmt == "raw":
        if dtype is None or shape is None:
            raise LayoutError(f"A raw file such as {str(source)!r} does not say its dtype "
                              "and shape.", "pass dtype= and shape= (CLI: --dtype uint16 "
                              "--shape N KY KX).")
        ds = read_raw(source, dtype=dtype, shape=shape, **options)
    else:
        ds = read_tiff(source, **options)
    return ds, validate(ds, layout)


def detect_format(source: str | PathLike[str]) -> str:
    """The format of ``source`` from its suffix (a glob or a plain directory is tiff)."""
    text = str(source)
    if any(char in text for char in "*?["):
        return "tiff"
    path = existing_path(text, "input")
    fmt = SUFFIXES.get(path.suffix.lower())
    if fmt:
        return fmt
    if path.is_dir():
        is_zarr = (path / "zarr.json").is_file() or (path / ".zgroup").is_file()
        return "zarr" if is_zarr else "tiff"
    raise LayoutError(
        f"Cannot tell the format of {text!r} from its suffix {path.suffix!r}.",
        f"pass format= one of {FORMATS}, or use a known suffix ({', '.join(SUFFIXES)}).",
    )


def _refuse_options(fmt: str, **options: Any) -> None:
    """LayoutError for an option given that does not apply to ``fmt``."""
    applies = {
        "dataset": ("hdf5",),
        "hdu": ("fits",),
        "dims": ("hdf5", "tiff", "fits", "npy", "raw", "zarr"),
        "arrays": ("hdf5", "tiff", "fits", "npy", "raw", "zarr"),
        "frames_per_chunk": ("hdf5", "tiff", "fits", "npz", "npy", "raw"),
        "dtype": ("raw",),
        "shape": ("raw",),
    }
    for name, value in options.items():
        if value is not None and fmt not in applies[name]:
            raise LayoutError(
                f"{name}= does not apply to {fmt} input (only to {', '.join(applies[name])}).",
                f"leave {name} out (output chunk sizes are set with chunks=).",
            )


def _relayout(
    source: str | PathLike[str],
    layout: str | None,
    dims: Sequence[str] | None,
    attrs: Mapping[str, Any] | None,
    arrays: Arrays | None,
) -> xr.Dataset:
    """A zarr store as a dataset of ``layout`` (its own layout when None), lazily."""
    ds = open_unchecked(source)
    if layout is not None:
        ds.attrs.pop(LAYOUT_ATTR, None)
    return arrange(ds, layout or detect_layout(ds), dims=dims, attrs=attrs, arrays=arrays)
