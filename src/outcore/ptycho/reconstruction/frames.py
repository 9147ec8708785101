"""Reading chosen patterns from a stored stack: what ``disk`` residency does every step.

A random batch touches most of the stored chunks, and zarr decodes each chunk it touches
whole, so reading ``n`` random patterns costs whole chunks. When the chunks are stored
uncompressed (``outcore ptycho preprocess``'s default: the bytes codec alone, little-endian,
on a local file system), each chunk file *is* the C-ordered array, so ``FrameReader`` reads
only the bytes of the patterns asked for, straight into the output (``readinto`` at each
pattern's offset). Nothing stays mapped, so the worker's resident memory does not grow with
what it has read. Any other store (a compressor, sharding, a remote store) is read through
zarr's orthogonal selection.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import zarr
from zarr.codecs import BytesCodec
from zarr.storage import LocalStore


class FrameReader:
    """Patterns ``(n, K, K)`` float32 of a zarr array ``(position, k_y, k_x)``."""

    def __init__(self, path: str | Path) -> None:
        self.array = zarr.open_array(path, mode="r")
        self.chunk = int(self.array.chunks[0])
        self.root = self._mappable_root()

    def _mappable_root(self) -> Path | None:
        """The array's directory when its chunk files are raw little-endian arrays."""
        meta = self.array.metadata
        codecs = getattr(meta, "codecs", ())
        raw = (len(codecs) == 1 and isinstance(codecs[0], BytesCodec)
               and self.array.dtype.byteorder in ("<", "=", "|"))
        if raw and isinstance(self.array.store, LocalStore):
            return Path(self.array.store.root) / self.array.path
        return None

    def read(self, positions: np.ndarray) -> np.ndarray:
        """The patterns at ``positions`` (sorted global indices), float32."""
        if self.root is None:
            return np.asarray(self.array.get_orthogonal_selection((positions,)), np.float32)
        frame = self.array.shape[1:]
        raw = np.empty((len(positions), *frame), self.array.dtype)
        nbytes = raw[0].nbytes if len(raw) else 0
        chunk_of = positions // self.chunk
        for index in np.unique(chunk_of):
            rows = np.nonzero(chunk_of == index)[0]
            path = self.root / self.array.metadata.encode_chunk_key(
                (int(index), *[0] * (self.array.ndim - 1)))
            if not path.exists():  # never written: fill values
                raw[rows] = self.array.get_orthogonal_selection((positions[rows],))
                continue
            with open(path, "rb", buffering=0) as chunk_file:
                for row in rows:
                    chunk_file.seek(int(positions[row] - index * self.chunk) * nbytes)
                    chunk_file.readinto(memoryview(raw[row]).cast("B"))
        return raw.astype(np.float32, copy=False)


@functools.lru_cache(maxsize=8)
def reader(path: str) -> FrameReader:
    """One reader per stored array and worker process."""
    return FrameReader(path)
