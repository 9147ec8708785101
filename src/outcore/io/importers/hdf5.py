"""HDF5 (and NeXus) importer: one dataset of a file, read with h5py block by block."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from os import PathLike
from typing import Any

import numpy as np
import xarray as xr

from outcore.checks import existing_path
from outcore.errors import LayoutError, reading
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
class HDF5Frames(FrameReader):
    """Frames of the HDF5 dataset ``dataset`` (internal path) in the file ``path``.

    A 2-D dataset is one frame.
    """

    path: str
    dataset: str

    def read(self, start: int, stop: int) -> np.ndarray:
        h5py = require("h5py")
        with h5py.File(self.path, "r") as f:
            node = f[self.dataset]
            return node[start:stop] if node.ndim == len(self.shape) else node[()][None]


def read_hdf5(
    path: str | PathLike[str],
    dataset: str | None,
    *,
    layout: str,
    dims: Sequence[str] | None = None,
    attrs: Mapping[str, Any] | None = None,
    arrays: Arrays | None = None,
    frames_per_chunk: int | None = None,
) -> xr.Dataset:
    """Lazy dataset of ``layout`` over the HDF5 dataset at internal path ``dataset``.

    ``dataset=None`` picks the file's only dataset with 2 or more axes. Blocks hold
    ``frames_per_chunk`` frames along axis 0 (default: ~64 MiB). ``arrays`` values that are
    strings name other datasets of the same file (e.g. ``{"angles": "/entry/angles"}``),
    read whole (they are small), or ``.npy``/text files.
    """
    h5py = require("h5py")
    path = existing_path(path, "HDF5 file")
    with reading(f"the HDF5 file {str(path)!r}", REWRITE_FIX), h5py.File(path, "r") as f:
        node = _dataset(f, dataset, path, h5py)
        shape = node.shape if node.ndim != 2 else (1, *node.shape)
        reader = HDF5Frames(shape, native(node.dtype), str(path), node.name)
        arrays = {
            name: f[value][()] if isinstance(value, str) and isinstance(f.get(value), h5py.Dataset)
            else value
            for name, value in (arrays or {}).items()
        }
    return frames_dataset(
        reader.to_dask(frames_per_chunk), layout, f"{path}:{reader.dataset}",
        dims=dims, attrs=attrs, arrays=arrays,
    )


#: HDF5 and NeXus files in the importers' registry.
IMPORTER = Importer("hdf5", (".h5", ".hdf5", ".hdf", ".nxs", ".nx5"),
                    ("dataset", "dims", "arrays", "frames_per_chunk"), read_hdf5)


#: The fix of an external link whose file is not there.
DANGLING_FIX = ("copy the linked file beside the master file, where the link's relative path"
                " points, or pass another dataset.")


def dangling_link(f: Any, name: str, h5py: Any) -> str | None:
    """Words naming the external link at ``name`` when its target cannot be opened (a
    master file copied without its detector files), else None. h5py resolves a link's file
    relative to the master file's folder first."""
    try:
        link = f.get(name, getlink=True)
    except (KeyError, ValueError):
        return None
    if not isinstance(link, h5py.ExternalLink):
        return None
    return (f"{name!r} is an external link to {link.path!r} in {link.filename!r}, which cannot"
            " be opened (no such file beside the master file, or no such dataset in it)")


def _dataset(f: Any, dataset: str | None, path: Any, h5py: Any) -> Any:
    """The h5py Dataset asked for, or LayoutError listing the datasets the file has."""
    found: list[Any] = []
    f.visititems(lambda _, obj: found.append(obj) if isinstance(obj, h5py.Dataset) else None)
    if dataset is None:
        images = [node for node in found if node.ndim >= 2]
        if len(images) == 1:
            return images[0]
        problem = f"{str(path)!r} holds {len(images)} datasets with 2 or more axes."
    else:
        node = f.get(dataset)
        if isinstance(node, h5py.Dataset):
            return node
        dangling = dangling_link(f, dataset, h5py)
        if dangling:
            raise LayoutError(f"{str(path)!r}: {dangling}.", DANGLING_FIX)
        problem = f"{str(path)!r} has no dataset {dataset!r}."
    listing = ", ".join(f"{node.name} {node.shape} {node.dtype}" for node in found[:30])
    more = f" and {len(found) - 30} more" if len(found) > 30 else ""
    raise LayoutError(
        f"{problem} Its datasets are: {listing or 'none'}{more}.",
        "pass dataset= one of those internal paths, e.g. dataset='/entry/data/data'.",
    )
