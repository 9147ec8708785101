"""NPY and raw binary importers: a ``.npy`` stack, or a headerless file of known dtype and shape.

Both are memory-mapped inside each dask task, which copies out only its own frames, so a
stack of any size is read block by block and never whole.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from os import PathLike
from typing import Any

import numpy as np
import xarray as xr

from outcore.checks import existing_path
from outcore.errors import LayoutError, reading
from outcore.io.importers import Arrays, FrameReader, Importer, frames_dataset, native


@dataclass
class MappedFrames(FrameReader):
    """Frames of the array stored at byte ``offset`` of ``path`` in ``file_dtype``.

    ``shape`` is the array's shape (a 2-D array counts as one frame); ``dtype`` is
    ``file_dtype`` in native byte order.
    """

    path: str
    offset: int
    file_dtype: np.dtype
    fortran_order: bool = False

    def read(self, start: int, stop: int) -> np.ndarray:
        mapped = np.memmap(self.path, self.file_dtype, "r", self.offset, self.shape,
                           "F" if self.fortran_order else "C")
        return np.array(mapped[start:stop], dtype=self.dtype)


def read_npy(
    path: str | PathLike[str],
    *,
    layout: str,
    dims: Sequence[str] | None = None,
    attrs: Mapping[str, Any] | None = None,
    arrays: Arrays | None = None,
    frames_per_chunk: int | None = None,
) -> xr.Dataset:
    """Lazy dataset of ``layout`` over the array of a ``.npy`` file (read from its header).

    Blocks hold ``frames_per_chunk`` frames along axis 0 (default: ~64 MiB).
    """
    path = existing_path(path, "npy file")
    with reading(f"the npy file {str(path)!r}", "save a numeric stack with np.save, or import"
                 " the file as raw (format='raw') with its dtype and shape."):
        mapped = np.load(path, mmap_mode="r", allow_pickle=False)
    if not isinstance(mapped, np.memmap):
        raise LayoutError(f"{str(path)!r} is not a .npy file.",
                          "point at a .npy stack (an .npz is read with format='npz').")
    shape, dtype, offset = mapped.shape, mapped.dtype, mapped.offset
    fortran = not mapped.flags.c_contiguous and mapped.flags.f_contiguous
    del mapped
    reader = _reader(path, tuple(shape), dtype, offset, fortran)
    return frames_dataset(reader.to_dask(frames_per_chunk), layout, str(path), dims=dims,
                          attrs=attrs, arrays=arrays)


def read_raw(
    path: str | PathLike[str],
    *,
    dtype: Any,
    shape: Sequence[int],
    layout: str,
    dims: Sequence[str] | None = None,
    attrs: Mapping[str, Any] | None = None,
    arrays: Arrays | None = None,
    frames_per_chunk: int | None = None,
) -> xr.Dataset:
    """Lazy dataset of ``layout`` over a headerless binary file of ``dtype`` and ``shape``.

    ``dtype`` is a numpy dtype or its name, with byte order if not native (``">u2"``:
    big-endian uint16); ``shape`` the array's shape in C order, e.g. ``(n, 256, 256)``. The
    file's size must be exactly ``prod(shape) * itemsize`` bytes.
    """
    path = existing_path(path, "raw file")
    try:
        dtype = np.dtype(dtype)
    except TypeError as err:
        raise LayoutError(f"dtype={dtype!r} is not a numpy dtype.",
                          "give e.g. uint16, <f4 or >u2 (big-endian).") from err
    shape = tuple(int(n) for n in shape)
    if not shape or min(shape) < 1:
        raise LayoutError(f"shape={shape} is not an array shape.",
                          "give every axis a positive size, e.g. shape=(n, 256, 256).")
    expected = math.prod(shape) * dtype.itemsize
    size = path.stat().st_size
    if size != expected:
        raise LayoutError(
            f"{str(path)!r} has {size} bytes; shape {shape} of {dtype.str} needs {expected}.",
            "give the file's true shape= and dtype= (a file with a header cannot be read "
            "as raw: strip the header first).",
        )
    reader = _reader(path, shape, dtype, 0, False)
    return frames_dataset(reader.to_dask(frames_per_chunk), layout, str(path), dims=dims,
                          attrs=attrs, arrays=arrays)


def _read_raw_file(path: str | PathLike[str], *, dtype: Any, shape: Sequence[int] | None,
                   **options: Any) -> xr.Dataset:
    """``read_raw`` for the registry: a raw file needs its dtype and shape given."""
    if dtype is None or shape is None:
        raise LayoutError(f"A raw file such as {str(path)!r} does not say its dtype "
                          "and shape.", "pass dtype= and shape=, e.g. dtype='uint16',"
                          " shape=(N, KY, KX).")
    return read_raw(path, dtype=dtype, shape=shape, **options)


#: ``.npy`` stacks and headerless binary files in the importers' registry.
NPY = Importer("npy", (".npy",), ("dims", "arrays", "frames_per_chunk"), read_npy)
RAW = Importer("raw", (".raw", ".bin"), ("dims", "arrays", "frames_per_chunk", "dtype", "shape"),
               _read_raw_file)


def _reader(path: Any, shape: tuple[int, ...], dtype: np.dtype, offset: int,
            fortran: bool) -> MappedFrames:
    if len(shape) < 2:
        raise LayoutError(f"{str(path)!r} holds an array of shape {shape}; a stack needs 2 "
                          "or more axes.", "point at the frames, not a 1-D array.")
    frames = shape if len(shape) > 2 else (1, *shape)
    return MappedFrames(frames, native(dtype), str(path), offset, np.dtype(dtype), fortran)
