"""The ``ptycho-preprocessed`` store: written once, chunk by chunk, by
``save_preprocessed``; opened and checked before any compute by ``open_preprocessed``;
``read_amplitudes`` reads the patterns of given positions straight from it."""

from __future__ import annotations

from collections.abc import Sequence
from os import PathLike
from pathlib import Path

import dask
import dask.array as da
import numpy as np
import xarray as xr
import zarr
from zarr.codecs import BloscCodec

from outcore import io
from outcore.checks import existing_path
from outcore.errors import LayoutError, OutcoreError, refuse_existing
from outcore.io.store import open_unchecked, write_new
from outcore.ptycho.optics import positive_attr
from outcore.ptycho.preprocessing.scan import CHUNK_POSITIONS

#: ``outcore_layout`` attr of a preprocessed store.
LAYOUT = "ptycho-preprocessed"
#: Store codecs of ``amplitudes``: none (fastest random reads), or the io layer's zstd.
COMPRESSIONS = {"none": None,
                "zstd": BloscCodec(cname="zstd", clevel=1, shuffle="bitshuffle")}


def save_preprocessed(ds: xr.Dataset, path: str | PathLike[str], *,
                      compression: str = "none") -> Path:
    """Write a preprocessed dataset as a new zarr v3 store, chunk by chunk; return the path.

    ``amplitudes`` keeps its chunks along ``position`` (one zarr chunk per dask chunk, whole
    patterns), uncompressed by default (``compression="zstd"``: the io layer's Blosc zstd-1).
    Written into ``<name>.partial-<id>`` and renamed when complete; never overwrites.
    """
    path = Path(path).expanduser()
    refuse_existing(path)
    if compression not in COMPRESSIONS:
        raise OutcoreError(f"compression {compression!r} is not known.",
                           f"use one of {sorted(COMPRESSIONS)}.")
    amplitudes = ds["amplitudes"].data
    if not isinstance(amplitudes, da.Array):
        amplitudes = da.from_array(np.asarray(amplitudes), chunks=(CHUNK_POSITIONS, -1, -1))
    step = max(amplitudes.chunks[0])
    out = ds.assign(amplitudes=(ds["amplitudes"].dims, amplitudes.rechunk((step, -1, -1))))
    codec = COMPRESSIONS[compression]
    for name, var in out.variables.items():
        var.encoding = {"compressors": (codec,) if codec and name == "amplitudes" else None}
        if name == "amplitudes":
            var.encoding["chunks"] = (step, *var.shape[1:])
    return write_new(out, path)


def open_preprocessed(path: str | PathLike[str], *, check_values: bool = False) -> xr.Dataset:
    """Open a preprocessed store lazily (dask chunks = the store's chunks) and check it.

    Checks, reading only the small arrays: the layout attr, the four variables with their
    dims, dtypes and shapes (and the optional detector ``mask(k_y, k_x)`` bool, True where a
    pixel is ignored), the attrs (wavelength, pixel_size, reciprocal_pixel_size,
    object_shape, detector_size), that every window lies inside the object, that the
    positions agree with ``top_left``, and that the probe guess is finite.
    ``check_values=True`` adds one pass over ``amplitudes`` refusing NaN, Inf and negatives.
    Raises LayoutError naming the problem and the fix.
    """
    path = existing_path(path, "preprocessed store")
    ds = open_unchecked(path)
    if ds.attrs.get(io.LAYOUT_ATTR) != LAYOUT:
        raise LayoutError(
            f"{str(path)!r} is not a preprocessed ptychography store (its "
            f"{io.LAYOUT_ATTR} attr is {ds.attrs.get(io.LAYOUT_ATTR)!r}, not {LAYOUT!r}).",
            "preprocess the diffraction stack first (outcore.ptycho.preprocess, or ptycho "
            "preprocess on the command line).")
    if "amplitudes" in ds.variables:
        stored = zarr.open_array(path / "amplitudes", mode="r").chunks[0]
        ds = ds.chunk({"position": stored})
    check_preprocessed(ds, str(path), check_values=check_values)
    return ds


def check_preprocessed(ds: xr.Dataset, name: str = "the dataset",
                       check_values: bool = False) -> None:
    """The checks of ``open_preprocessed`` on a dataset (see there)."""
    fix_rerun = "preprocess the stack again with outcore ptycho preprocess."
    expected = {"amplitudes": (("position", "k_y", "k_x"), "f"),
                "top_left": (("position", "yx"), "iu"),
                "positions": (("position", "xy"), "f"),
                "probe_guess": (("k_y", "k_x"), "c")}
    for var, (dims, kinds) in expected.items():
        if var not in ds.variables:
            raise LayoutError(f"{name} has no variable {var!r}; it has "
                              f"{sorted(map(str, ds.variables))}.", fix_rerun)
        if ds[var].dims != dims or ds[var].dtype.kind not in kinds:
            raise LayoutError(f"{var} in {name} has dims {ds[var].dims} and dtype "
                              f"{ds[var].dtype}; expected dims {dims}.", fix_rerun)
    for attr in ("wavelength", "pixel_size", "reciprocal_pixel_size"):
        if attr not in ds.attrs:
            raise LayoutError(f"{name} has no attr {attr!r}; it has {sorted(ds.attrs)}.",
                              fix_rerun)
        positive_attr(ds.attrs[attr], attr, "SI units")
    n, ky, kx = ds["amplitudes"].shape
    k = ds.attrs.get("detector_size")
    if ky != kx or k != ky or ds["probe_guess"].shape != (k, k) \
            or ds.sizes["xy"] != 2 or ds.sizes["yx"] != 2:
        raise LayoutError(
            f"{name} is inconsistent: amplitudes ({n}, {ky}, {kx}), detector_size {k}, "
            f"probe_guess {ds['probe_guess'].shape}, xy {ds.sizes.get('xy')}, yx "
            f"{ds.sizes.get('yx')}.", fix_rerun)
    pixel = ds.attrs["pixel_size"]
    if abs(pixel * k * ds.attrs["reciprocal_pixel_size"] - 1) > 1e-6:
        raise LayoutError(f"{name}: pixel_size {pixel} is not 1 / (detector_size * "
                          "reciprocal_pixel_size).", fix_rerun)
    shape = ds.attrs.get("object_shape")
    if not (isinstance(shape, list | tuple) and len(shape) == 2
            and all(isinstance(v, int) and v >= k for v in shape)):
        raise LayoutError(f"{name} has object_shape {shape!r}; expected [rows, cols], each "
                          f"at least the window {k}.", fix_rerun)
    top_left = np.asarray(ds["top_left"].values)
    outside = (top_left < 0).any(axis=1) | (top_left + k > np.asarray(shape)).any(axis=1)
    if outside.any():
        first = int(np.argmax(outside))
        raise LayoutError(
            f"{int(outside.sum())} of {n} windows lie outside the {shape[0]}x{shape[1]} "
            f"object, e.g. position {first} with top_left {top_left[first].tolist()} and "
            f"window {k}.", "give a larger object_shape, or " + fix_rerun)
    positions = np.asarray(ds["positions"].values)
    off = np.abs(positions[:, ::-1] / pixel - k / 2 - top_left)
    if not np.isfinite(positions).all() or (off > 0.5 + 1e-6).any():
        raise LayoutError(f"{name}: positions are non-finite or disagree with top_left "
                          "(more than half a pixel).", fix_rerun)
    if not np.isfinite(np.asarray(ds["probe_guess"].values)).all():
        raise LayoutError(f"{name}: probe_guess has NaN or Inf values.", fix_rerun)
    if "mask" in ds.variables and (ds["mask"].dims != ("k_y", "k_x")
                                   or ds["mask"].dtype != bool):
        raise LayoutError(f"mask in {name} has dims {ds['mask'].dims} and dtype "
                          f"{ds['mask'].dtype}; expected ('k_y', 'k_x') bool.", fix_rerun)
    if check_values:
        amplitudes = ds["amplitudes"].data
        bad = int(dask.compute((~(da.isfinite(amplitudes) & (amplitudes >= 0))).sum())[0])
        if bad:
            raise LayoutError(f"amplitudes in {name} has {bad} NaN, Inf or negative values.",
                              fix_rerun)


def read_amplitudes(store: str | PathLike[str] | zarr.Array,
                    index: Sequence[int] | np.ndarray) -> np.ndarray:
    """Amplitudes (len(index), K, K) float32 of the positions ``index`` (any order), read
    straight from the store with zarr, touching only the chunks that hold them.

    ``store`` is the preprocessed store's path, or its ``amplitudes`` array already opened
    with ``zarr.open_array(path / "amplitudes", mode="r")`` (cheaper when reading often).
    """
    index = np.asarray(index, dtype=np.int64)
    order = np.argsort(index, kind="stable")
    array = store if isinstance(store, zarr.Array) else zarr.open_array(
        Path(store) / "amplitudes", mode="r")
    out = np.empty((len(index), *array.shape[1:]), dtype=array.dtype)
    out[order] = array.oindex[index[order]]
    return out
