"""Open and save outcore stores: zarr v3 groups, lazy on read, written chunk by chunk.

``save`` never overwrites and never leaves half a store: it writes into a sibling
``<name>.partial-<id>`` directory (``partial_path``) and renames it to the target only once
every chunk is on disk. The finite-value check of the layouts that refuse NaN/Inf runs inside
the write tasks (each block is checked between its read and its write), so it costs no extra
read pass and fails the save at the first bad block.

``open`` refuses a store whose metadata cannot be read, and reads every chunk through
``read_block``, so that a chunk that fails to decode during compute names the store, the
variable and the chunk (``InputDamagedError``) instead of a codec's bare error.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import shutil
import sys
import time
import warnings
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING

import dask
import dask.array as da
import dask.threaded
import numcodecs
import numpy as np
import xarray as xr
import zarr
from dask.array.core import getter
from dask.base import get_scheduler
from dask.delayed import Delayed
from dask.system import CPU_COUNT
from zarr.codecs import BloscCodec, BytesCodec
from zarr.storage import LocalStore

from outcore.checks import existing_path
from outcore.errors import LayoutError, partial_path, reading, refuse_existing, unreadable
from outcore.io.layouts import LAYOUT_ATTR, finite_variables, validate

if TYPE_CHECKING:
    import distributed

#: Target size of one block (one dask chunk, one zarr chunk) when none is given, bytes.
BLOCK_BYTES = 64 * 2**20

STRING = np.dtypes.StringDType()

_RESTORE = ("restore the store from a good copy, or write it again from its source (e.g."
            " outcore convert).")

#: The codec of numeric arrays, recorded in each array's zarr.json: Blosc's zstd at level 1
#: on bit-shuffled bytes, in blocks of 2 MiB. Chosen by ``benchmarks/bench_read.py --codecs``
#: (32 MiB chunks decoded on one core, its CPU time; docs/performance.md has the table): it
#: packs detector counts tighter than Blosc's default blocks did (Poisson counts of mean 5
#: as float32 7.0x against 6.2x, as uint16 4.4x against 4.1x; sparse 4D-STEM counts 24x
#: against 21x) and decodes them 1.2-1.3x faster (1.4 and 1.55 GB/s a core against 1.05 and
#: 1.3); Blosc's lz4 decodes at 2.1 GB/s but packs those counts 5.0x, 3.9x and 8.8x, below
#: the old codec, and no candidate that zarr reads packs them as tight and decodes faster.
COMPRESSOR = BloscCodec(cname="zstd", clevel=1, shuffle="bitshuffle", blocksize=2 * 2**20)


def frames_per_block(frame_shape: tuple[int, ...], itemsize: int,
                     target_bytes: int = BLOCK_BYTES) -> int:
    """Frames (slices along axis 0) of ``frame_shape`` that fill about ``target_bytes``."""
    return max(1, target_bytes // max(1, math.prod(frame_shape) * itemsize))


def open(  # noqa: A001 - `outcore.open` is the public contract
    path: str | PathLike[str],
    *,
    layout: str | None = None,
    chunks: Mapping[str, int] | None = None,
    check_values: bool = False,
) -> xr.Dataset:
    """Open an outcore store as a lazy, validated ``xarray.Dataset`` backed by dask.

    Arrays keep the store's own chunks unless ``chunks`` maps dims to chunk sizes.
    ``check_values=True`` also reads everything once to refuse non-finite values.
    """
    ds = open_unchecked(path, chunks)
    validate(ds, layout, check_values=check_values)
    return ds


def open_unchecked(path: str | PathLike[str], chunks: Mapping[str, int] | None = None
                   ) -> xr.Dataset:
    """Open a zarr store lazily without checking its layout (chunks as in ``open``)."""
    path = existing_path(path, "store")
    v3 = (path / "zarr.json").is_file()
    if not v3 and not (path / ".zgroup").is_file():
        raise LayoutError(
            f"{str(path)!r} is not a zarr store (it has no zarr.json or .zgroup).",
            "point at the store's top directory, or import the file with "
            "outcore.io.convert(source, output).",
        )
    with reading(f"the metadata of the store {str(path)!r}", _RESTORE):
        return xr.open_dataset(
            path, engine="zarr", chunks={} if chunks is None else dict(chunks),
            consolidated=False if v3 else None,
            from_array_kwargs={"getitem": functools.partial(read_block, store=str(path))},
            # each read task holds the zarr array itself: as a task of its own, every read
            # depended on it, so a stage's first tasks all went to the worker holding it and
            # the others only stole them later (a 256^3 FBP's 2 backprojections 0.8 s apart)
            inline_array=True,
        )


def read_block(array: object, key: tuple, asarray: bool = True, lock: object = None, *,
               store: str) -> np.ndarray:
    """dask's ``getter`` for the chunks of ``store``: a chunk that cannot be read or decoded
    becomes an ``InputDamagedError`` naming the store, the variable, the chunk and its file."""
    try:
        return getter(array, key, asarray=asarray, lock=lock)
    except MemoryError:
        raise
    except Exception as err:
        raise unreadable(f"{_chunk_of(array, key)} of the store {store!r}", err, _RESTORE
                         ) from err


def _chunk_of(array: object, key: tuple) -> str:
    """Words naming the (first) zarr chunk that the block ``key`` of ``array`` (xarray's
    lazy wrapper of a zarr array) covers: ``chunk (1, 0, 0) of variable 'volume' (file
    volume/c/1/0/0)``; only the block's start when the wrapper does not show its zarr array."""
    inner = array
    for _ in range(8):  # xarray's adapters, down to its ZarrArrayWrapper
        if hasattr(inner, "_array"):
            inner = inner._array
            break
        inner = getattr(inner, "array", None)
    name = str(getattr(inner, "name", "") or "").strip("/")
    shape = getattr(inner, "chunks", None)
    starts = [k.start or 0 for k in key if isinstance(k, slice)]
    if not name or not shape or len(starts) != len(shape):
        return f"the block at {tuple(starts)}"
    first = tuple(int(s // c) for s, c in zip(starts, shape, strict=True))
    words = f"chunk {first} of variable {name!r}"
    with contextlib.suppress(Exception):
        words += f" (file {name}/{inner.metadata.encode_chunk_key(first)})"
    return words


class WholeChunks:
    """The variable ``name`` of the zarr v3 store at ``path`` as an array whose blocks of
    whole chunks are decoded straight from their files into the block, for ``read_array``.

    zarr's own read decodes each chunk into a buffer of its own and copies it into the
    block, two more sweeps over the bytes than the decode (measured on a 32 MiB chunk of
    float32 counts: 0.064 CPU s through zarr against 0.033 for the decode alone). Where the
    array is stored as outcore writes it (zarr's ``bytes`` codec in this machine's byte
    order, then Blosc, no sharding, on a local disk) and a block is whole chunks (its
    slices start on the chunk grid and end on it or at the array's end), each chunk is
    decoded by numcodecs' Blosc into its place in the block (an edge chunk, stored padded,
    through a buffer); any other block, and any other array, is read by zarr.
    """

    def __init__(self, path: str | PathLike[str], name: str) -> None:
        self.path = Path(path)
        self.name = name
        self.array = zarr.open_array(self.path / name, mode="r")
        self.shape = self.array.shape
        self.dtype = self.array.dtype
        self.ndim = self.array.ndim
        self.chunks = self.array.chunks
        codecs = self.array.metadata.codecs if self.array.metadata.zarr_format == 3 else ()
        native = np.dtype(self.dtype).isnative and np.dtype(self.dtype).kind in "biuf"
        self.direct = (native and isinstance(self.array.store, LocalStore)
                       and len(codecs) == 2 and isinstance(codecs[0], BytesCodec)
                       and (codecs[0].endian is None
                            or codecs[0].endian.value == sys.byteorder)
                       and isinstance(codecs[1], BloscCodec))

    def __getitem__(self, key: tuple) -> np.ndarray:
        grid = self._grid(key)
        if grid is None:
            return self.array[key]
        out = np.empty(tuple(s.stop - s.start for s in key), self.dtype)
        for coords in itertools.product(*grid):
            self._decode(coords, key, out)
        return out

    def _grid(self, key: tuple) -> list[range] | None:
        """The chunk coordinates ``key`` covers, by dim, where it is whole chunks that can
        be decoded directly; else None."""
        if not self.direct or not isinstance(key, tuple) or len(key) != self.ndim:
            return None
        grid = []
        for s, n, c in zip(key, self.shape, self.chunks, strict=True):
            if (not isinstance(s, slice) or s.step not in (None, 1) or s.start is None
                    or s.stop is None or s.start % c or not (s.stop % c == 0 or s.stop == n)
                    or not 0 <= s.start < s.stop <= n):
                return None
            grid.append(range(s.start // c, -(-s.stop // c)))
        return grid

    def _decode(self, coords: tuple[int, ...], key: tuple, out: np.ndarray) -> None:
        """Chunk ``coords`` into its place in ``out``, the block ``key``."""
        starts = [i * c for i, c in zip(coords, self.chunks, strict=True)]
        stops = [min(a + c, n) for a, c, n in zip(starts, self.chunks, self.shape, strict=True)]
        place = out[tuple(slice(a - s.start, b - s.start)
                          for a, b, s in zip(starts, stops, key, strict=True))]
        file = self.path / self.name / self.array.metadata.encode_chunk_key(coords)
        try:
            raw = file.read_bytes()
        except FileNotFoundError:  # never written: zarr's fill value
            place[...] = self.array.fill_value
            return
        try:
            edge = place.shape != tuple(self.chunks)
            if edge or not place.flags.c_contiguous:
                whole = np.empty(self.chunks, self.dtype)
                _BLOSC.decode(raw, out=whole)
                place[...] = whole[tuple(slice(0, n) for n in place.shape)]
            else:
                _BLOSC.decode(raw, out=place)
        except MemoryError:
            raise
        except Exception as err:
            raise unreadable(f"chunk {coords} of variable {self.name!r} (file"
                             f" {self.name}/{self.array.metadata.encode_chunk_key(coords)}) of"
                             f" the store {str(self.path)!r}", err, _RESTORE) from err


#: Any Blosc buffer's decoder (its header holds the codec, the shuffle and the type size).
_BLOSC = numcodecs.Blosc()


def read_array(path: str | PathLike[str], name: str, chunks: tuple[int, ...]) -> da.Array:
    """The variable ``name`` of the store at ``path`` as a dask array of blocks ``chunks``
    (a size per dim), each read task decoding its whole chunks straight into its block
    (``WholeChunks``)."""
    source = WholeChunks(path, name)
    return da.from_array(source, chunks=chunks, inline_array=True,
                         name=f"read-{name}-{dask.base.tokenize(str(source.path), name, chunks)}")


def save(
    ds: xr.Dataset,
    path: str | PathLike[str],
    *,
    layout: str | None = None,
    chunks: Mapping[str, int] | None = None,
    compute: Callable[[Delayed], object] | None = None,
) -> Path:
    """Validate ``ds`` and write it as a new zarr v3 store at ``path``; return the path.

    Dask arrays are written block by block (on the active distributed Client, if any);
    numpy arrays are chunked first. Each dim gets regular chunks, from ``chunks`` (dim ->
    size) or else from the largest variable: its dask chunks, or ~64 MiB blocks along its
    first dim. Zarr chunks equal the dask chunks. A NaN/Inf where the layout refuses them
    fails the write at its block and leaves nothing at ``path``; an existing ``path`` is
    refused with RunExistsError. ``compute(write)`` runs the write on a distributed client
    where given (a command's, showing its progress).
    """
    path = Path(path).expanduser()
    refuse_existing(path)
    layout = validate(ds, layout)
    return write_new(_prepare(ds, layout, chunks or {}), path, compute)


def write_new(ds: xr.Dataset, path: str | PathLike[str],
              compute: Callable[[Delayed], object] | None = None) -> Path:
    """Write ``ds`` as it is (encodings included; strings as variable-length UTF-8,
    ``zarr_strings``) as a new zarr v3 store at ``path``, with consolidated metadata, through
    ``<name>.partial-<id>``, renamed when every chunk is written; an existing ``path`` is
    refused and nothing is left behind on failure. ``compute(write)`` computes the write
    (e.g. on a client, showing progress); default: the active scheduler."""
    path = Path(path).expanduser()
    refuse_existing(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = partial_path(path)
    ds = zarr_strings(ds)
    try:
        _run(ds.to_zarr(partial, mode="w-", zarr_format=3, consolidated=False, compute=False),
             compute)
        consolidate(partial)
        refuse_existing(path)
        partial.rename(path)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return path


def consolidate(path: str | PathLike[str]) -> None:
    """Gather the metadata of the zarr v3 store at ``path`` into its root ``zarr.json``, so
    that a plain ``xr.open_zarr(path)`` opens it in one read and without xarray's warning
    about missing consolidated metadata. zarr's own warning that consolidated metadata is
    not yet in the v3 specification is the writer's concern, silenced here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Cc]onsolidated metadata",
                                category=UserWarning)
        zarr.consolidate_metadata(str(path))


def _run(write: Delayed, compute: Callable[[Delayed], object] | None = None) -> None:
    """Compute ``write`` with ``compute``, else on the active scheduler; if it fails, wait
    until none of its tasks still runs (the local thread pool is drained, distributed
    workers are polled), so no write outlives a failed save and the cleanup that follows is
    final."""
    scheduler = get_scheduler(collections=[write])
    if compute is None and scheduler is dask.threaded.get:
        with ThreadPoolExecutor(dask.config.get("num_workers", None) or CPU_COUNT) as pool:
            dask.compute(write, scheduler=dask.threaded.get, pool=pool)
        return
    try:
        (compute or dask.compute)(write)
    except BaseException:
        import distributed

        client = getattr(scheduler, "__self__", None)
        if isinstance(client, distributed.Client):
            _wait_until_idle(client, {str(key) for key in write.__dask_graph__()})
        raise


def _wait_until_idle(client: distributed.Client, keys: set[str], timeout: float = 300) -> None:
    """Return once no worker runs a task among ``keys`` (cancelled ones finish their block)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(keys & running for running in client.run(_running_keys).values()):
            return
        time.sleep(0.05)


def _running_keys(dask_worker: distributed.Worker) -> set[str]:
    return {str(task.key) for task in dask_worker.state.all_running_tasks}


def _prepare(ds: xr.Dataset, layout: str, chunks: Mapping[str, int]) -> xr.Dataset:
    """The dataset to write: regular chunks, encodings and the finite-value check of each
    block in front of its write (``write_new`` stores its strings as zarr's)."""
    check_chunks(ds, chunks)
    out = ds.copy()
    out = out.chunk({dim: chunks.get(str(dim)) or _default_chunk(out, dim) for dim in out.dims})
    for name in finite_variables(out, layout):
        var = out.variables[name]
        out = _replace(out, name, var.copy(data=refuse_nonfinite(var.data, str(name), layout)))
    for var in out.variables.values():
        var.encoding = {"chunks": tuple(c[0] for c in var.chunks)} if var.chunks else {}
        if var.dtype.kind in "biufc":
            var.encoding["compressors"] = (COMPRESSOR,)
    out.attrs = {**ds.attrs, LAYOUT_ATTR: layout}
    return out


def check_chunks(ds: xr.Dataset, chunks: Mapping[str, int]) -> None:
    """LayoutError when ``chunks`` (dim -> size, as ``save`` takes it) names a dim that
    ``ds`` does not have."""
    unknown = set(chunks) - set(map(str, ds.dims))
    if unknown:
        raise LayoutError(
            f"chunks names dims {sorted(unknown)} that the dataset does not have.",
            f"use dims among {sorted(map(str, ds.dims))}.",
        )


def zarr_strings(ds: xr.Dataset) -> xr.Dataset:
    """``ds`` with every string variable (numpy fixed-width or object) as numpy's
    variable-length ``StringDType``, which zarr v3 stores as its specified variable-length
    UTF-8 (fixed-width strings get zarr's unstable-specification warning); encodings kept."""
    for name, var in ds.variables.items():
        if var.dtype.kind in "UO":
            encoding = var.encoding
            ds = _replace(ds, name, var.astype(STRING))
            ds[name].encoding = encoding
    return ds


def _replace(ds: xr.Dataset, name: object, var: xr.Variable) -> xr.Dataset:
    """``ds`` with variable ``name`` (a coordinate or a data variable) replaced by ``var``."""
    return ds.assign_coords({name: var}) if name in ds.coords else ds.assign({name: var})


def _default_chunk(ds: xr.Dataset, dim: object) -> int:
    """Chunk size of ``dim``: the largest variable's dask chunk, else ~64 MiB along axis 0."""
    var = max((v for v in ds.variables.values() if dim in v.dims),
              key=lambda v: v.size * v.dtype.itemsize)
    axis = var.dims.index(dim)
    if var.chunks:
        return max(var.chunks[axis])
    if axis == 0:
        return frames_per_block(var.shape[1:], var.dtype.itemsize)
    return max(1, var.shape[axis])


def refuse_nonfinite(data: da.Array, name: str, layout: str, source: str | None = None
                     ) -> da.Array:
    """``data`` with each block checked as it passes: LayoutError at the first block holding
    NaN or Inf, which ``layout`` refuses in ``name``. ``source`` names the input store the
    data was read from (default: the data is being saved). No extra pass over the data."""
    return da.map_blocks(_refuse_nonfinite, data, dtype=data.dtype, name_=name, layout=layout,
                         source=source)


def _refuse_nonfinite(block: np.ndarray, name_: str, layout: str, source: str | None,
                      block_info: dict | None = None) -> np.ndarray:
    """Pass ``block`` through, or raise LayoutError at its first NaN/Inf."""
    bad = ~np.isfinite(block)
    if bad.any():
        origin = tuple(start for start, _ in block_info[0]["array-location"])
        first = tuple(int(i) for i in np.argwhere(bad)[0] + origin)
        where = f" of the input {source!r}" if source else ""
        found = (f"{name_}{where} has {int(bad.sum())} non-finite values (NaN or Inf) in the"
                 f" block starting at {origin}, the first at index {first}; {layout} refuses"
                 " them")
        if source:
            raise LayoutError(f"{found}.", f"replace them in the input (e.g. ds[{name_!r}] ="
                              f" ds[{name_!r}].fillna(0), saved anew with outcore.save), or"
                              " drop the bad frames.")
        raise LayoutError(
            f"{found}, so nothing was saved.",
            f"replace them before saving, e.g. ds[{name_!r}] = ds[{name_!r}].fillna(0), or "
            "drop the bad frames.",
        )
    return block
