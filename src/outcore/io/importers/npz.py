"""NPZ importer: a cutout catalog from ``np.savez`` / ``np.savez_compressed`` arrays.

Members stored uncompressed (``np.savez``) are memory-mapped at their data offset inside the
zip, so any block reads only its own frames. Compressed members (``np.savez_compressed``)
can only be read front to back: each process keeps one open stream per member and moves it
forward block by block; a block before the stream's position re-reads the member from its
start. Reading them is therefore sequential (one decompression pass per process when the
blocks come in order, as in ``convert``).
"""

from __future__ import annotations

import os
import struct
import threading
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO, Any

import numpy as np
import xarray as xr

from outcore.checks import existing_path
from outcore.errors import LayoutError, reading
from outcore.io.importers import REWRITE_FIX, FrameReader, Importer, arrange

#: Open streams of compressed members, by (pid, path, member): (zip, stream, data start).
_STREAMS: dict[tuple[int, str, str], tuple[zipfile.ZipFile, IO[bytes], int]] = {}
_STREAMS_LOCK = threading.Lock()


@dataclass
class NpzMember(FrameReader):
    """Frames (rows along axis 0) of the array ``member`` of the npz file ``path``.

    ``offset`` is the byte offset of the array data in the file for a stored member, None
    for a compressed one.
    """

    path: str
    member: str
    offset: int | None
    fortran_order: bool = False

    def read(self, start: int, stop: int) -> np.ndarray:
        if self.offset is not None:
            mapped = np.memmap(self.path, self.dtype, "r", self.offset, self.shape,
                               "F" if self.fortran_order else "C")
            return np.array(mapped[start:stop])
        frame_bytes = int(np.prod(self.shape[1:])) * self.dtype.itemsize
        with _STREAMS_LOCK:
            key = (os.getpid(), self.path, self.member)
            if key not in _STREAMS:
                _STREAMS[key] = _open_compressed(self.path, self.member)
            archive, stream, data_start = _STREAMS[key]
            stream.seek(data_start + start * frame_bytes)
            raw = stream.read((stop - start) * frame_bytes)
            if stop == self.shape[0]:
                del _STREAMS[key]
                stream.close()
                archive.close()
        return np.frombuffer(raw, self.dtype).reshape(stop - start, *self.shape[1:])


def read_npz(
    path: str | os.PathLike[str],
    *,
    attrs: Mapping[str, Any] | None = None,
    frames_per_chunk: int | None = None,
) -> xr.Dataset:
    """Lazy cutouts dataset over an npz file.

    Needs ``images`` (candidate, y, x) and ``candidate_id`` (candidate,); ``variance`` and
    ``mask`` of the images' shape are optional; any other 1-D array of one value per
    candidate becomes a per-candidate column. Blocks hold ``frames_per_chunk`` candidates
    (default: ~64 MiB).
    """
    path = existing_path(path, "npz file")
    with reading(f"the NPZ file {str(path)!r}", f"{REWRITE_FIX[:-1]}, e.g. with np.savez(path,"
                 " images=..., candidate_id=...)."):
        members = _members(path)
    for needed in ("images", "candidate_id"):
        if needed not in members:
            raise LayoutError(
                f"{str(path)!r} has no array {needed!r}; it has {sorted(members)}.",
                "save the catalog with np.savez(path, images=..., candidate_id=..., "
                "[variance=..., mask=..., center_x=..., ...]).",
            )
    images = members["images"]
    if len(images.shape) != 3:
        raise LayoutError(
            f"images in {str(path)!r} has shape {images.shape}; cutouts need 3 axes "
            "(candidate, y, x).",
            "stack the cutouts into one (candidate, y, x) array.",
        )
    n = images.shape[0]
    variables = {}
    for name, reader in members.items():
        stack = name in ("images", "variance", "mask")
        expected = images.shape if stack else (n,)
        if reader.shape != expected:
            raise LayoutError(
                f"{name} in {str(path)!r} has shape {reader.shape}; expected {expected} "
                f"({'the shape of images' if stack else 'one value per candidate'}).",
                f"save {name} with shape {expected}, or leave it out of the npz.",
            )
        dims = ("candidate", "y", "x") if stack else ("candidate",)
        variables[name] = (dims, reader.to_dask(frames_per_chunk))
    return arrange(xr.Dataset(variables), "cutouts", attrs=attrs)


def _read_catalog(
    path: str | os.PathLike[str],
    *,
    layout: str | None,
    attrs: Mapping[str, Any] | None,
    frames_per_chunk: int | None,
) -> xr.Dataset:
    """``read_npz`` for the registry: an npz file holds cutouts, whatever layout is asked."""
    if layout not in (None, "cutouts"):
        raise LayoutError(f"An npz catalog holds cutouts, not {layout}.",
                          "leave layout out (or pass layout='cutouts').")
    return read_npz(path, attrs=attrs, frames_per_chunk=frames_per_chunk)


#: NPZ cutout catalogs in the importers' registry.
IMPORTER = Importer("npz", (".npz",), ("frames_per_chunk",), _read_catalog, needs_layout=False,
                    layout="cutouts")


def _members(path: os.PathLike[str]) -> dict[str, NpzMember]:
    """A reader for each ``.npy`` member of the npz file, from the headers only."""
    readers = {}
    with zipfile.ZipFile(path) as archive, open(path, "rb") as raw:
        for info in archive.infolist():
            name = info.filename.removesuffix(".npy")
            with archive.open(info) as stream:
                shape, fortran, dtype = _header(stream, name, path)
                header_bytes = stream.tell()
            offset = None
            if info.compress_type == zipfile.ZIP_STORED:
                offset = _data_offset(raw, info) + header_bytes
            elif fortran and len(shape) > 1:
                raise LayoutError(
                    f"{name} in {str(path)!r} is compressed and in Fortran order, so its "
                    "frames cannot be read one block at a time.",
                    "save it C-contiguous (np.ascontiguousarray) or with np.savez.",
                )
            readers[name] = NpzMember(shape, np.dtype(dtype), str(path), info.filename,
                                      offset, fortran)
    return readers


def _header(stream: IO[bytes], name: str, path: Any) -> tuple[tuple[int, ...], bool, np.dtype]:
    version = np.lib.format.read_magic(stream)
    read = {(1, 0): np.lib.format.read_array_header_1_0,
            (2, 0): np.lib.format.read_array_header_2_0}.get(version)
    if read is None:
        raise LayoutError(
            f"{name} in {str(path)!r} uses .npy format {version}, which outcore cannot stream.",
            "re-save the npz with a current numpy (np.savez).",
        )
    shape, fortran, dtype = read(stream)
    if dtype.hasobject:
        raise LayoutError(
            f"{name} in {str(path)!r} holds Python objects (pickled), which cannot be "
            "streamed.",
            f"save {name} as a numeric or fixed-width string array, e.g. "
            f"np.asarray({name}, dtype=str).",
        )
    return shape, fortran, dtype


def _data_offset(raw: IO[bytes], info: zipfile.ZipInfo) -> int:
    """Offset in the zip file of a member's first byte (after its local file header)."""
    raw.seek(info.header_offset)
    header = struct.unpack(zipfile.structFileHeader, raw.read(zipfile.sizeFileHeader))
    name_length, extra_length = header[-2:]
    return info.header_offset + zipfile.sizeFileHeader + name_length + extra_length


def _open_compressed(path: str, member: str) -> tuple[zipfile.ZipFile, IO[bytes], int]:
    archive = zipfile.ZipFile(path)
    stream = archive.open(member)
    _header(stream, member, path)
    return archive, stream, stream.tell()
