"""Importers: lazy datasets over HDF5, TIFF, FITS, NPZ, NPY and raw files, read block by
block, and the re-layout of zarr stores.

Each importer module declares its format as an :class:`Importer` record (name, suffixes,
the options that apply, the reader), collected in ``outcore.io.importers.registry``, which
``outcore.io.convert`` walks to detect a format, refuse options and read. Each importer
describes its file with a :class:`FrameReader`, a small picklable array-like whose
``__getitem__`` opens the file, reads only the frames (slices along axis 0) asked for and
closes it, so a dask task can run anywhere the file is visible (threads, processes,
distributed workers). :func:`arrange` then names the axes and adds companion arrays and
attrs to make the dataset of a layout.
"""

from __future__ import annotations

import glob
import importlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from types import ModuleType
from typing import Any

import dask.array as da
import numpy as np
import xarray as xr

from outcore.checks import existing_path
from outcore.errors import InputNotFoundError, LayoutError, OutcoreError, reading
from outcore.io.layouts import LAYOUTS, Dims, Layout
from outcore.io.store import frames_per_block

#: Companion arrays given to an importer: values, or a string naming where to read them.
Arrays = Mapping[str, Any]
#: The fix of a file an importer cannot read.
REWRITE_FIX = ("check that the file was copied whole (compare its size with the original's),"
               " or write it again from its source.")
#: The options of ``read_source`` that apply to some formats only, in the order they are
#: checked: an ``Importer`` lists those it takes, and any other one given is refused.
OPTIONS = ("dataset", "hdu", "dims", "arrays", "frames_per_chunk", "dtype", "shape")


@dataclass(frozen=True)
class Importer:
    """One input format of ``outcore.io.convert``, a record of the importers' registry.

    ``name``: the format (``format=``, ``--format``); ``suffixes``: the file suffixes that
    name it (lower case, with the dot); ``options``: which of ``OPTIONS`` it takes.
    ``read(source, *, layout, attrs, **options)`` returns the lazy dataset, given the layout
    asked for (None when none was), the root attrs and each option it takes (None when not
    given); it reads metadata only. ``needs_layout``: the file does not say which layout it
    holds, so one must be given. ``layout``: the one layout the format always holds (npz:
    ``cutouts``), whose dataset is returned as read (``save`` validates it); any other
    dataset is validated against the layout asked for (or its own, for zarr).
    ``sequence``: a glob, or a directory no importer's ``directory`` claims, is a sequence
    of files of this format (tiff); ``directory(path)``: whether a directory is an input of
    this format (zarr: a store).
    """

    name: str
    suffixes: tuple[str, ...]
    options: tuple[str, ...]
    read: Callable[..., xr.Dataset]
    needs_layout: bool = True
    layout: str | None = None
    sequence: bool = False
    directory: Callable[[Path], bool] | None = None

    def __post_init__(self) -> None:
        unknown = sorted(set(self.options) - set(OPTIONS))
        if unknown:
            raise ValueError(f"importer {self.name!r}: options {unknown} are not in {OPTIONS}")


@dataclass
class FrameReader:
    """Array-like over the frames of one file, for ``dask.array.from_array``.

    ``shape`` is ``(frames, *frame_shape)`` and ``dtype`` native-endian; subclasses add what
    locates the data (path, dataset, HDU...) and implement ``read(start, stop)``.
    """

    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def read(self, start: int, stop: int) -> np.ndarray:
        """Frames ``start:stop``, shape ``(stop - start, *shape[1:])``."""
        raise NotImplementedError

    def __getitem__(self, key: tuple[slice | int, ...]) -> np.ndarray:
        """A block as dask asks for it: contiguous frames (or one frame, by its index, which
        dask passes down for ``stack[3]``), any slices of each frame."""
        key = key if isinstance(key, tuple) else (key,)
        if key and isinstance(key[0], int | np.integer):
            index = int(key[0]) + (self.shape[0] if key[0] < 0 else 0)
            if not 0 <= index < self.shape[0]:
                raise IndexError(f"frame {key[0]} of {self.shape[0]}")
            return self[(slice(index, index + 1), *key[1:])][0]
        start, stop, step = (key[0] if key else slice(None)).indices(self.shape[0])
        if step != 1:
            raise IndexError(f"{type(self).__name__} reads contiguous frames only (step 1).")
        with reading(f"frames {start}:{stop} of {self.source(start, stop)}", REWRITE_FIX):
            block = self.read(start, max(start, stop)).reshape(-1, *self.shape[1:])
        return np.asarray(block[(slice(None), *key[1:])], dtype=self.dtype)

    def source(self, start: int, stop: int) -> str:
        """Words naming the file that frames ``start:stop`` come from, for errors."""
        return repr(str(getattr(self, "path", "the file")))

    def to_dask(self, frames_per_chunk: int | None = None) -> da.Array:
        """A dask array with one task per block of ``frames_per_chunk`` frames (~64 MiB)."""
        step = frames_per_chunk or frames_per_block(self.shape[1:], self.dtype.itemsize)
        return da.from_array(
            self, chunks=(step, *self.shape[1:]), meta=np.empty((0,) * self.ndim, self.dtype)
        )


def is_glob(source: str | PathLike[str]) -> bool:
    """Whether ``source`` is a glob (a sequence of files) rather than a path."""
    return any(char in str(source) for char in "*?[")


def sequence_files(path_or_glob: str | PathLike[str], suffixes: Sequence[str],
                   kind: str) -> list[str]:
    """The files a path, a directory (its files ending in ``suffixes``) or a glob names, in
    natural order (``frame_2`` before ``frame_10``); InputNotFoundError when there is none.
    ``kind`` names the format in the messages (``"TIFF"``)."""
    text = str(path_or_glob)
    if is_glob(text):
        files = glob.glob(text)
    else:
        path = existing_path(text, f"{kind} input")
        if not path.is_dir():
            return [str(path)]
        files = [str(p) for p in path.iterdir() if p.suffix.lower() in suffixes]
    if not files:
        raise InputNotFoundError(
            f"No {kind} files match {text!r}.",
            f"check the directory or glob (files must end in {' or '.join(suffixes)}).",
        )
    return sorted(files, key=_natural_key)


def _natural_key(name: str) -> list[Any]:
    """Sorts names with their numbers as numbers: ``f2`` before ``f10``."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def native(dtype: np.dtype) -> np.dtype:
    """``dtype`` in the machine's byte order (files such as FITS are big-endian)."""
    return np.dtype(dtype).newbyteorder("=")


def require(module: str) -> ModuleType:
    """Import an optional dependency of the importers, or say how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise OutcoreError(
            f"Reading this format needs the Python package {module!r}, which is not installed.",
            "install outcore's io extra: pip install 'outcore[io]'.",
        ) from err


def arrange(
    ds: xr.Dataset,
    layout: str,
    *,
    dims: Sequence[str] | None = None,
    attrs: Mapping[str, Any] | None = None,
    arrays: Arrays | None = None,
) -> xr.Dataset:
    """Make ``ds`` (holding the layout's main variable) a dataset of ``layout``.

    ``dims`` names the main variable's axes in stored order (default: the layout's dims
    for its number of axes); the dataset is then transposed into the layout's order.
    ``arrays`` adds companions (``angles``, ``positions``, ``candidate_id`` or per-frame
    columns) as values or as ``.npy``/text file paths; ``attrs`` are added to the root,
    strings parsed as numbers or lists where they look like them.
    """
    lay = layout_of(layout)
    main = ds[lay.main.name]
    if dims is not None:
        dims = _checked_dims(lay, main, dims)
        interim = {old: f"__axis_{i}" for i, old in enumerate(main.dims)}
        ds = ds.rename_dims(interim).rename_dims(dict(zip(interim.values(), dims, strict=True)))
        main = ds[lay.main.name]
    target = [opt for opt in lay.main.dims if sorted(opt) == sorted(map(str, main.dims))]
    if target:
        ds = ds.transpose(*target[0], ...)
    for name, value in (arrays or {}).items():
        ds = _add_array(ds, lay, name, value)
    ds.attrs.update(parse_attrs(attrs or {}))
    return ds


def frames_dataset(
    data: da.Array,
    layout: str,
    source: str,
    *,
    dims: Sequence[str] | None = None,
    attrs: Mapping[str, Any] | None = None,
    arrays: Arrays | None = None,
) -> xr.Dataset:
    """The dataset of ``layout`` whose main variable is ``data`` (read from ``source``)."""
    lay = layout_of(layout)
    axes = tuple(f"axis_{i}" for i in range(data.ndim))
    ds = xr.Dataset({lay.main.name: (axes, data)})
    dims = default_dims(layout, data.shape, source) if dims is None else dims
    return arrange(ds, layout, dims=dims, attrs=attrs, arrays=arrays)


def layout_of(layout: str | None) -> Layout:
    """The Layout named ``layout``; LayoutError when it is unknown or not given."""
    if layout not in LAYOUTS:
        raise LayoutError(
            f"layout={layout!r} is not a known layout." if layout else
            "This input does not say which layout it holds.",
            f"pass layout= one of {sorted(LAYOUTS)}.",
        )
    return LAYOUTS[layout]


def default_dims(layout: str, shape: tuple[int, ...], source: str) -> Dims:
    """The layout's dims for a main array of ``shape`` (e.g. 4-D diffraction is a grid)."""
    lay = layout_of(layout)
    options = [opt for opt in lay.main.dims if len(opt) == len(shape)]
    if not options:
        raise LayoutError(
            f"{source} has shape {shape} ({len(shape)} axes); {layout} expects "
            + " or ".join(f"{len(opt)} axes {opt}" for opt in lay.main.dims) + ".",
            "point at the right dataset/HDU, or reshape the data before importing.",
        )
    return options[0]


def parse_attrs(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """Attrs with string values (``key=value`` from a command line) parsed where possible.

    ``"1e-10"`` -> 1e-10, ``"[1e-6, 2e-6]"`` or ``"1e-6,2e-6"`` -> [1e-6, 2e-6],
    ``"cone"`` stays a string.
    """
    return {key: _parse(value) if isinstance(value, str) else value
            for key, value in attrs.items()}


def _parse(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        pass
    if "," in text:
        try:
            return [float(part) for part in text.split(",")]
        except ValueError:
            pass
    return text


def _checked_dims(lay: Layout, main: xr.DataArray, dims: Sequence[str]) -> Dims:
    dims = tuple(dims)
    if len(dims) != main.ndim:
        raise LayoutError(
            f"dims={dims} names {len(dims)} axes but the data has {main.ndim} "
            f"(shape {main.shape}).",
            f"name every axis, in stored order, from {' or '.join(map(str, lay.main.dims))}.",
        )
    return dims


def _add_array(ds: xr.Dataset, lay: Layout, name: str, value: Any) -> xr.Dataset:
    values = _load_array(name, value)
    spec = next((var for var in lay.companions if var.name == name), None)
    dims = spec.dims[0] if spec else (ds[lay.main.name].dims[0],)
    if values.ndim != len(dims) or values.shape[0] != ds.sizes[dims[0]]:
        raise LayoutError(
            f"{name} has shape {values.shape}; {lay.name} needs dims {dims} with "
            f"{dims[0]}={ds.sizes[dims[0]]} (the length of {lay.main.name}'s {dims[0]} axis).",
            f"give one {name} value per {dims[0]}.",
        )
    ds = ds.assign({name: (dims, values)})
    if spec:
        ds = ds.assign_coords({dim: list(labels) for dim, labels in spec.labels.items()})
    return ds


def _load_array(name: str, value: Any) -> np.ndarray:
    if not isinstance(value, str | Path):
        return np.asarray(value)
    path = existing_path(value, f"file of {name}")
    if path.suffix == ".npy":
        return np.load(path)
    return np.loadtxt(path, delimiter="," if path.suffix == ".csv" else None, ndmin=1)
