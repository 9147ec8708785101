"""zarr importer: an outcore (or plain xarray) zarr store, re-laid out or re-chunked."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from os import PathLike
from pathlib import Path
from typing import Any

import xarray as xr

from outcore.io.importers import Arrays, Importer, arrange
from outcore.io.layouts import LAYOUT_ATTR, detect_layout
from outcore.io.store import open_unchecked


def relayout(
    source: str | PathLike[str],
    *,
    layout: str | None,
    dims: Sequence[str] | None = None,
    attrs: Mapping[str, Any] | None = None,
    arrays: Arrays | None = None,
) -> xr.Dataset:
    """A zarr store as a dataset of ``layout`` (its own layout when None), lazily."""
    ds = open_unchecked(source)
    if layout is not None:
        ds.attrs.pop(LAYOUT_ATTR, None)
    return arrange(ds, layout or detect_layout(ds), dims=dims, attrs=attrs, arrays=arrays)


def is_store(path: Path) -> bool:
    """Whether the directory ``path`` is a zarr store (v3 ``zarr.json`` or v2 ``.zgroup``)."""
    return (path / "zarr.json").is_file() or (path / ".zgroup").is_file()


#: zarr stores in the importers' registry: a store keeps its own layout unless one is given.
IMPORTER = Importer("zarr", (".zarr",), ("dims", "arrays"), relayout, needs_layout=False,
                    directory=is_store)
