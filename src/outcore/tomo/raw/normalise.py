"""Flat-field normalisation of raw frames, block by block: ``-log`` of the transmission.

:func:`normalise` turns one block of raw frames into line integrals::

    projections = -log(clip((raw - dark) / (flat - dark), eps, None))    # float32

:func:`normalise_block` does it with a flat (and dark) made per frame from several groups,
:func:`normalised` builds the lazy ``projections`` dataset whose every block is read and
normalised in one task (the readers of ``outcore.tomo.raw.beamline`` call it), and
:func:`memory_model` is that task's memory for ``outcore.plan``.
"""

from __future__ import annotations

import math
from typing import Any

import dask.array as da
import numpy as np
import xarray as xr

from outcore.backend import array_namespace
from outcore.errors import LayoutError
from outcore.io.importers import FrameReader, frames_dataset
from outcore.plan import TaskMemory

#: Smallest transmission kept before the log (a dead or saturated pixel gives -log(eps)).
EPS = 1e-6

#: Scratch of :func:`normalise` in float32 blocks besides its input and output (measured with
#: tracemalloc: 3 for float32 frames, 3 plus the float32 copy of integer or float64 frames).
NORMALISE_SCRATCH_BLOCKS = 3
#: More scratch of :func:`normalise_block` for each of the flat and the dark made per frame
#: (several groups, ``nearest`` or ``linear``; measured with tracemalloc: 3.2 blocks more
#: when both are).
PER_FRAME_SCRATCH_BLOCKS = 2


def normalise(raw: Any, flat: Any, dark: Any, *, eps: float = EPS) -> Any:
    """``-log(clip((raw - dark) / (flat - dark), eps, None))`` of one block, in float32.

    ``raw`` is ``(frames, v, u)`` (or one frame); ``flat`` and ``dark`` broadcast against it
    (``(v, u)`` averages). numpy or cupy arrays (the namespace of ``raw``). A pixel whose
    ``flat - dark`` is not positive carries no signal: its transmission is taken as 1 (value 0)
    rather than a NaN or Inf.
    """
    xp = array_namespace(raw)
    raw = xp.asarray(raw, dtype=xp.float32)
    flat = xp.asarray(flat, dtype=xp.float32)
    dark = xp.asarray(dark, dtype=xp.float32)
    denominator = flat - dark
    good = denominator > 0
    ratio = (raw - dark) / xp.where(good, denominator, xp.float32(1))
    ratio = xp.where(good, ratio, xp.float32(1))
    return (-xp.log(xp.clip(ratio, xp.float32(eps), None))).astype(xp.float32)


def normalise_block(raw: Any, flat_weights: Any, flats: Any, dark_weights: Any, darks: Any,
                    *, eps: float = EPS) -> Any:
    """:func:`normalise` of a block of frames ``(n, v, u)`` whose flat (and dark) is a
    weighted sum of group frames: ``flats`` ``(K, v, u)`` weighted by ``flat_weights``
    ``(n, K)`` (one group: the same flat for every frame, never broadcast to a block)."""
    xp = array_namespace(raw)

    def per_frame(weights: Any, frames: Any) -> Any:
        frames = xp.asarray(frames, dtype=xp.float32)
        if frames.shape[0] == 1:
            return frames[0]
        return xp.tensordot(xp.asarray(weights, dtype=xp.float32), frames, axes=1)

    return normalise(raw, per_frame(flat_weights, flats), per_frame(dark_weights, darks),
                     eps=eps)


def normalised(reader: FrameReader, flats: np.ndarray, flat_weights: np.ndarray,
               darks: np.ndarray, dark_weights: np.ndarray, radians: np.ndarray,
               layout_attrs: dict[str, Any], *, eps: float, frames_per_chunk: int | None,
               flat_mode: str, counts: dict[str, int] | None = None,
               source: str | None = None) -> xr.Dataset:
    """The lazy ``projections`` dataset: each block of ``reader``'s frames normalised by
    :func:`normalise_block` in the task that reads it. ``flats`` ``(K, v, u)`` and ``darks``
    are the group frames, ``flat_weights`` ``(n, K)`` (and ``dark_weights``) each frame's
    weights; ``radians`` the angle of each frame; ``counts`` the frames of each kind;
    ``source`` names the frames in messages (default: the HDF5 file and dataset)."""
    if not any((flat - dark > 0).any() for flat in flats for dark in darks):
        raise LayoutError(
            "The flats minus the darks are zero or negative at every pixel, so no "
            "transmission can be computed.",
            "check that the flats are the open-beam frames and the darks the closed-shutter "
            "frames (not swapped, not the same dataset).",
        )
    raw = reader.to_dask(frames_per_chunk)
    views = raw.chunks[0]

    def groups(frames: np.ndarray, weights: np.ndarray) -> tuple[da.Array, da.Array]:
        return (da.from_array(weights, chunks=(views, weights.shape[1])),
                da.from_array(frames.astype(np.float32), chunks=frames.shape))

    flat_w, flat_d = groups(flats, flat_weights)
    dark_w, dark_d = groups(darks, dark_weights)
    projections = da.blockwise(normalise_block, "ijk", raw, "ijk", flat_w, "ig", flat_d, "gjk",
                               dark_w, "ih", dark_d, "hjk", concatenate=True, eps=eps,
                               dtype=np.float32, meta=np.empty((0, 0, 0), np.float32))
    name = source or f"{reader.path}:{reader.dataset}"
    ds = frames_dataset(projections, "projections", name,
                        dims=("view", "v", "u"), attrs=layout_attrs,
                        arrays={"angles": radians})
    ds["projections"].attrs.update(
        raw_dtype=reader.dtype.name, normalisation="-log((raw - dark) / (flat - dark))",
        flat_mode=flat_mode, flat_groups=int(flats.shape[0]), dark_groups=int(darks.shape[0]),
        **({"frames": counts} if counts else {}))
    return ds


def memory_model(ds: xr.Dataset) -> list[TaskMemory]:
    """The task of a beamline import: read a block of raw frames and normalise it.

    Holds the raw block (its own dtype, ``raw_dtype``), its float32 copy and the float32
    output, plus :data:`NORMALISE_SCRATCH_BLOCKS` float32 blocks of scratch, plus
    :data:`PER_FRAME_SCRATCH_BLOCKS` for each of the flat and the dark made per frame.
    """
    data = ds["projections"].data
    attrs = ds["projections"].attrs
    frames = max(data.chunks[0])
    block = frames * math.prod(data.shape[1:])
    raw = np.dtype(attrs.get("raw_dtype", "float64")).itemsize
    per_frame = sum(attrs.get(key, 1) > 1 for key in ("flat_groups", "dark_groups"))
    scratch = NORMALISE_SCRATCH_BLOCKS + PER_FRAME_SCRATCH_BLOCKS * per_frame
    return [TaskMemory("read-and-normalise", tasks=len(data.chunks[0]),
                       input_bytes=block * (raw + 4), output_bytes=block * 4,
                       transient_bytes=scratch * block * 4,
                       read_bytes=block * raw, write_bytes=block * 4)]
