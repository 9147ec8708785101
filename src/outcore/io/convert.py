"""``convert``: import a file into a new outcore store, or re-lay out / re-chunk a store.

The formats are the records of ``outcore.io.importers.registry.IMPORTERS``: ``read_source``
detects one (``detect_format``), refuses the options it does not take and reads it.
"""

from __future__ import annotations

import glob
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from os import PathLike
from pathlib import Path
from typing import Any

import xarray as xr

from outcore.checks import existing_path
from outcore.errors import LayoutError, refuse_existing
from outcore.io.importers import OPTIONS, Arrays, Importer, is_glob
from outcore.io.importers.registry import IMPORTERS
from outcore.io.layouts import LAYOUTS, validate
from outcore.io.store import save

#: Formats ``convert`` reads, in the registry's order.
FORMATS = tuple(importer.name for importer in IMPORTERS)
#: The format of each file suffix.
SUFFIXES = {suffix: importer.name for importer in IMPORTERS for suffix in importer.suffixes}


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

    ``format`` is one of hdf5, cxi, tiff, fits, npz, npy, raw, zarr, or ``auto`` (from the
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
    importer = next((imp for imp in IMPORTERS if imp.name == fmt), None)
    if importer is None:
        raise LayoutError(f"format={format!r} is not known.", f"use one of {FORMATS} or 'auto'.")
    given = dict(dataset=dataset, hdu=hdu, dims=dims, arrays=arrays,
                 frames_per_chunk=frames_per_chunk, dtype=dtype, shape=shape)
    _refuse_options(importer, given)
    if importer.needs_layout and layout is None:
        raise LayoutError(
            f"A {fmt} file does not say which layout it holds.",
            f"pass layout= one of {sorted(LAYOUTS)}.",
        )
    ds = importer.read(source, layout=layout, attrs=attrs,
                       **{name: given[name] for name in importer.options})
    if importer.layout is not None:
        return ds, importer.layout
    return ds, validate(ds, layout)


def detect_format(source: str | PathLike[str]) -> str:
    """The format of ``source`` from its suffix; a glob, or a directory that no importer
    claims, is a sequence of files of the format its files' suffixes name (tiff when they
    name none)."""
    text = str(source)
    if is_glob(text):
        return _sequence_format(Path(name).suffix for name in glob.glob(text))
    path = existing_path(text, "input")
    fmt = SUFFIXES.get(path.suffix.lower())
    if fmt:
        return fmt
    if path.is_dir():
        return next((imp.name for imp in IMPORTERS if imp.directory and imp.directory(path)),
                    None) or _sequence_format(p.suffix for p in path.iterdir())
    raise LayoutError(
        f"Cannot tell the format of {text!r} from its suffix {path.suffix!r}.",
        f"pass format= one of {FORMATS}, or use a known suffix ({', '.join(SUFFIXES)}).",
    )


def _sequence_format(suffixes: Iterable[str]) -> str:
    """The sequence importer that most of ``suffixes`` name (the first one, tiff, when
    none does): its reader then names the files that do not fit."""
    sequences = [imp.name for imp in IMPORTERS if imp.sequence]
    named = Counter(SUFFIXES.get(suffix.lower()) for suffix in suffixes)
    counted = [(named[name], -i, name) for i, name in enumerate(sequences)]
    return max(counted)[2]


def _refuse_options(importer: Importer, given: Mapping[str, Any]) -> None:
    """LayoutError for an option given that does not apply to ``importer``'s format."""
    for name in OPTIONS:
        if given[name] is not None and name not in importer.options:
            applies = [imp.name for imp in IMPORTERS if name in imp.options]
            raise LayoutError(
                f"{name}= does not apply to {importer.name} input (only to"
                f" {', '.join(applies)}).",
                f"leave {name} out (output chunk sizes are set with chunks=).",
            )
