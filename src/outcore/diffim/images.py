"""A pair as a Python user holds it: ``xarray.DataArray`` images, or FITS paths, checked and
turned into the ``manifest.Pair`` whose windows every task reads.

FITS paths take the one-pair form of a manifest (``manifest.one_pair``). DataArrays
(``(y, x)`` in any order, numpy- or dask-backed) are checked before anything is computed:
2-D, real, at least ``MIN_IMAGE_EDGE`` a side, a variance of its image's shape, a mask of
the reference's, a numpy image with finite pixels, one pixel grid (the same shape, and the
target's WCS, if any, agreeing with the reference's: ``wcs``); a reference without WCS needs
``aligned=True`` or ``register='stars'``. Their WCS, gain, saturation level and zeropoint
come from their attrs (``wcs.of_attrs``, ``wcs.card``). ``write_arrays`` then writes them
into a zarr store in a scratch folder (``Scratch``: removed when the last pair, or lazy
result, that reads it is gone): the workers read windows of it (``StoredImage``) as they
read a FITS file's, so no task receives a whole image.
"""

from __future__ import annotations

import shutil
import tempfile
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from os import PathLike
from pathlib import Path
from typing import Any

import dask
import dask.array as da
import distributed
import numpy as np
import xarray as xr

from outcore.arguments import data_array
from outcore.diffim import wcs
from outcore.diffim.manifest import (
    FWHM_KEYS,
    GAIN_KEYS,
    MIN_IMAGE_EDGE,
    SATURATION_KEYS,
    ZEROPOINT_KEYS,
    Pair,
    check_same_grid,
    checked_psf,
    item_fwhm,
    one_pair,
    read_psf,
)
from outcore.errors import ArgumentError, LayoutError

#: The image arguments of a pair, in the manifest's names.
IMAGE_KEYS = ("reference", "target", "reference_variance", "target_variance", "mask")
#: Images on the target's own grid (different from the reference's when registered).
TARGET_GRID = ("target", "target_variance")
#: Side (pixels) of the chunks of the scratch store.
STORE_CHUNK = 512


class Scratch:
    """A scratch folder, removed with everything in it when this object is collected (or
    at exit)."""

    def __init__(self, parent: str | PathLike[str] | None) -> None:
        parent = parent or dask.config.get("temporary-directory", None) or None
        if parent is not None:
            Path(parent).mkdir(parents=True, exist_ok=True)
        self.path = tempfile.mkdtemp(prefix="outcore-diffim-", dir=parent)
        weakref.finalize(self, shutil.rmtree, self.path, True)

    def __dask_tokenize__(self) -> str:
        return self.path

    def __reduce__(self) -> tuple:  # a worker's copy is the path only, it removes nothing
        return (str, (self.path,))


@dataclass(frozen=True)
class StoredImage:
    """One image of a pair in the scratch zarr store (``store``, array ``name``), read by
    windows like ``manifest.ImageFile``; ``saturation`` as there; ``scratch`` keeps the
    folder while the image is in use."""

    store: str
    name: str
    shape: tuple[int, int]
    gain: float | None = None
    saturation: float | None = None
    scratch: Any = field(default=None, compare=False, repr=False)

    @property
    def path(self) -> str:
        return f"{self.store}/{self.name}"

    def read(self, y0: int, y1: int, x0: int, x1: int) -> np.ndarray:
        """Pixels ``[y0:y1, x0:x1]`` (inside the image) as float64, NaN where saturated."""
        import zarr

        pixels = np.asarray(zarr.open_array(self.store, path=self.name, mode="r")[y0:y1, x0:x1],
                            dtype=np.float64)
        if self.saturation is not None:
            pixels[pixels >= self.saturation] = np.nan
        return pixels


def is_path(value: Any) -> bool:
    return isinstance(value, str | PathLike)


def file_pair(images: Mapping[str, Any], psfs: Mapping[str, Any], *, flux_ratio: float | None,
              zeropoint: float | None, saturation: float | None, grid: str, stack: str,
              item_id: str, fwhm: Any = None) -> tuple[Pair, list]:
    """The pair of FITS paths (``images``; PSFs as paths or arrays), checked as a manifest's
    one-pair form is, and its files (role, path, SHA-256)."""
    files = {k: None if v is None else str(v) for k, v in images.items()}
    files |= {k: str(v) for k, v in psfs.items() if v is not None and is_path(v)}
    pairs, found = one_pair(files, flux_ratio, item_id, zeropoint, grid, stack, saturation,
                            fwhm)
    given = {k: checked_psf(np.asarray(v), f"{k}=") for k, v in psfs.items()
             if v is not None and not is_path(v)}
    return replace(pairs[0], **given), found


def array_pair(images: Mapping[str, Any], psfs: Mapping[str, Any], *,
               flux_ratio: float | None, zeropoint: float | None, saturation: float | None,
               grid: str, item_id: str, workdir: str | PathLike[str] | None, fwhm: Any = None
               ) -> tuple[Pair, dict[str, xr.DataArray]]:
    """The pair of DataArrays ``images`` (None: not given), checked (the module docstring),
    reading from a scratch store that ``write_arrays`` fills, and the arrays to write there.
    PSFs are paths (``.npy``, FITS) or 2-D arrays; ``fwhm`` (pixels: one for both images,
    or two) else the images' ``FWHM_KEYS`` cards."""
    arrays = {k: _image(v, k) for k, v in images.items() if v is not None}
    reference, target = arrays["reference"], arrays["target"]
    for key, array in arrays.items():
        own = "target" if grid == "stars" and key in TARGET_GRID else "reference"
        if array.shape != arrays[own].shape:
            registered = " (registered with register='stars')" if own == "target" else ""
            raise LayoutError(
                f"{key}= is {_size(array)} pixels but {own}= is {_size(arrays[own])}: the"
                f" images of a pair must share one pixel grid{registered}.",
                "resample it onto the reference's grid first (e.g. with reproject), or give"
                " register='stars' to register the target on the stars of both images."
                if key == "target" else f"give {key}= on the {own}'s grid.")
    ref_wcs, tgt_wcs = wcs.of_attrs(reference.attrs), wcs.of_attrs(target.attrs)
    if ref_wcs is None and grid == "wcs":
        raise LayoutError(
            "reference= has no celestial WCS in its attrs, so nothing says whether target= is"
            " on its pixel grid.",
            "if both images are already on one pixel grid, give aligned=True; else register"
            " the target on the stars of both with register='stars'; or give each its WCS:"
            " reference.attrs['wcs'] = astropy.wcs.WCS(header).")
    if ref_wcs is not None and grid != "stars":
        check_same_grid(ref_wcs, tgt_wcs, reference.shape, "target=",
                        "resample the target onto the reference's grid first (e.g. with"
                        " reproject), or fix its WCS in target.attrs['wcs'].")
    scratch = Scratch(workdir)
    store = str(Path(scratch.path) / "images.zarr")
    stored = {}
    for key, array in arrays.items():
        level = None
        if key in ("reference", "target"):
            level = saturation if saturation is not None else wcs.card(array.attrs,
                                                                       SATURATION_KEYS)
        stored[key] = StoredImage(store, key, array.shape,
                                  wcs.card(array.attrs, GAIN_KEYS) if key in ("reference",
                                                                              "target")
                                  else None, level, scratch)
    zeropoint, source = _zeropoint(zeropoint, reference, target)
    checked = {k: _psf(v, f"{k}=") for k, v in psfs.items() if v is not None}
    cards = [wcs.card(a.attrs, FWHM_KEYS) for a in (reference, target)]
    widths = item_fwhm(fwhm, tuple(c if c is not None and c > 0 else None for c in cards),
                       "fwhm=")
    pair = Pair(item_id, stored["reference"], stored["target"], reference.shape,
                stored.get("reference_variance"), stored.get("target_variance"),
                stored.get("mask"), checked.get("reference_psf"), checked.get("target_psf"),
                flux_ratio, None if ref_wcs is None else wcs.text(ref_wcs), zeropoint, source,
                grid, fwhm=widths)
    return pair, {k: _on_grid(a, k, grid) for k, a in arrays.items()}


def write_arrays(pair: Pair, arrays: Mapping[str, xr.DataArray],
                 client: distributed.Client) -> None:
    """Write ``arrays`` into ``pair``'s scratch store: numpy-backed ones from this process,
    dask-backed ones on ``client``'s workers, with a check that each image holds a finite
    pixel (a ``LayoutError`` naming it before any task of the pair runs)."""
    store = pair.reference.store
    ds = xr.Dataset({k: a.variable for k, a in arrays.items()})
    for name, var in ds.variables.items():
        var.encoding = {"chunks": tuple(min(STORE_CHUNK, n) for n in var.shape)}
        if not isinstance(var.data, da.Array):
            _finite(np.asarray(var.data), name)
    lazy = [name for name, var in ds.variables.items() if isinstance(var.data, da.Array)]
    write = ds.to_zarr(store, mode="w-", zarr_format=3, consolidated=False, compute=False)
    if not lazy:
        return
    checks = [da.isfinite(ds[name].data).any() for name in lazy if name in IMAGE_KEYS[:2]]
    done = client.gather(client.compute([write, *checks]))
    for name, finite in zip([n for n in lazy if n in IMAGE_KEYS[:2]], done[1:], strict=True):
        if not finite:
            _no_finite_pixel(name)


def _image(value: Any, key: str) -> xr.DataArray:
    """``value`` as a ``(y, x)`` DataArray of real numbers, at least ``MIN_IMAGE_EDGE`` a
    side; a numpy-backed image (not a variance or mask) with a finite pixel."""
    array = data_array(value, ("y", "x"), key)
    kind = array.dtype.kind
    if kind not in ("fiu" + ("b" if key == "mask" else "")):
        raise ArgumentError(f"{key}= holds {array.dtype} values, not real numbers.",
                            f"give {key}= as a real image (e.g. {key}.real, or float32).")
    if min(array.shape) < MIN_IMAGE_EDGE:
        raise LayoutError(f"{key}= is {_size(array)} pixels, smaller than {MIN_IMAGE_EDGE} on"
                          " a side.", "give larger images.")
    if key in ("reference", "target") and not isinstance(array.data, da.Array):
        _finite(np.asarray(array.data), key)
    return array


def _finite(values: np.ndarray, key: str) -> None:
    if key in ("reference", "target") and not np.isfinite(values).any():
        _no_finite_pixel(key)


def _no_finite_pixel(key: str) -> None:
    raise LayoutError(f"{key}= has no finite pixel: every value is NaN or infinite.",
                      f"check {key}= (a failed read or a mask applied as NaN everywhere).")


def _size(array: xr.DataArray) -> str:
    return f"{array.shape[0]} x {array.shape[1]}"


def _on_grid(array: xr.DataArray, key: str, grid: str) -> xr.DataArray:
    """The array as the scratch store keeps it: the target's grid named apart when it is
    registered (its shape may differ), in native byte order (FITS data is big-endian),
    plain values without attrs."""
    names = ("target_y", "target_x") if grid == "stars" and key in TARGET_GRID else ("y", "x")
    return xr.DataArray(array.data.astype(array.dtype.newbyteorder("="), copy=False), dims=names,
                        name=key)


def _psf(value: Any, key: str) -> np.ndarray:
    """A PSF stamp from a path or an array, checked (``manifest.checked_psf``)."""
    if is_path(value):
        return read_psf(value, key)
    return checked_psf(np.asarray(value), key)


def _zeropoint(given: float | None, reference: xr.DataArray, target: xr.DataArray
               ) -> tuple[float | None, str]:
    """The pair's zeropoint and its source: given (the reference's), else the first of
    ``ZEROPOINT_KEYS`` among the reference's attrs' cards, else the target's."""
    if given is not None:
        return float(given), "given"
    for role, array in (("reference", reference), ("target", target)):
        for key in ZEROPOINT_KEYS:
            value = wcs.card(array.attrs, (key,))
            if value is not None:
                return value, f"{role} {key}"
    return None, ""

