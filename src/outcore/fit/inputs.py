"""What a fit reads, checked before any compute: the cutout catalog and the PSF.

``catalog_of`` takes what a user holds (a Dataset in the ``cutouts`` layout, a DataArray of
``images``, the path of a store or of an importer's file such as NPZ) and returns the
catalog with its stamps as ``(candidate, y, x)``: a catalog stored ``(candidate, x, y)`` is
reordered, never misread. ``psf_of`` checks the PSF a model needs against the catalog.
``open_catalog`` and ``load_psf`` read them from files. Each problem is one ``OutcoreError``
naming the argument and the fix.
"""

from __future__ import annotations

from os import PathLike
from pathlib import Path
from typing import Any

import dask.array as da
import numpy as np
import xarray as xr

from outcore import io
from outcore.checks import existing_path
from outcore.errors import ArgumentError, InputNotFoundError, LayoutError
from outcore.fit.models import Model
from outcore.io.layouts import validate

__all__ = ["catalog_of", "load_psf", "open_catalog", "psf_of"]

#: The dims of a catalog's stamps and of its PSFs, in the order the fit works in.
STAMP_DIMS = ("candidate", "y", "x")
PSF_DIMS = ("candidate", "psf_y", "psf_x")


def open_catalog(path: str | PathLike[str]) -> xr.Dataset:
    """A cutout catalog, lazily: an outcore store, or any importer format that carries
    ``candidate_id`` (NPZ; FITS and HDF5 after ``outcore.io.convert(..., arrays=...)``)."""
    source = existing_path(path, "catalog")
    if source.is_dir() and (source / "zarr.json").exists():
        return io.open(source, layout="cutouts")
    ds, _ = io.read_source(source, layout="cutouts")
    return ds


def load_psf(path: str | PathLike[str] | None) -> np.ndarray | None:
    """A PSF array from ``.npy`` or FITS (first HDU with data), float64."""
    if path is None:
        return None
    source = Path(path)
    if not source.exists():
        raise InputNotFoundError(f"The PSF file {str(path)!r} does not exist.",
                                 "check psf= (a .npy or FITS file, or an array).")
    if source.suffix == ".npy":
        psf = np.load(source)
    elif source.suffix.lower() in (".fits", ".fit", ".fts"):
        from astropy.io import fits

        with fits.open(source) as hdus:
            psf = next(h.data for h in hdus if h.data is not None)
    else:
        raise LayoutError(f"Cannot read a PSF from {source.suffix!r} files.",
                          "give psf= a .npy or FITS file.")
    if psf.ndim not in (2, 3):
        raise LayoutError(f"The PSF has shape {psf.shape}; expected (py, px) or (n, py, px).",
                          "give one stamp, or one stamp per candidate.")
    return np.asarray(psf, dtype=np.float64)


def catalog_of(value: Any) -> xr.Dataset:
    """``value`` as a checked cutout catalog, its stamps ``(candidate, y, x)``: a Dataset in
    the ``cutouts`` layout (any dim order), a DataArray of images (its ``candidate``
    coordinate, else 0..n-1, as ``candidate_id``) or the path of a catalog
    (``open_catalog``). LayoutError when it does not fit the layout or holds no candidate."""
    if isinstance(value, str | PathLike):
        value = open_catalog(value)
    elif isinstance(value, xr.DataArray):
        value = _from_images(value)
    elif not isinstance(value, xr.Dataset):
        raise ArgumentError(
            f"catalog= is a {type(value).__name__}, not a cutout catalog: outcore needs to"
            f" know which axis is which of {STAMP_DIMS}.",
            f"pass catalog=xr.DataArray(images, dims={STAMP_DIMS}), a Dataset in the cutouts"
            " layout (images, variance, candidate_id) or the path of a catalog.")
    catalog = value.transpose(*STAMP_DIMS, "psf_y", "psf_x", ..., missing_dims="ignore")
    validate(catalog, "cutouts")
    if catalog.sizes["candidate"] == 0:
        raise LayoutError("The catalog has no candidates.", "pass a catalog with at least one.")
    return catalog


def _from_images(images: xr.DataArray) -> xr.Dataset:
    if "candidate" not in images.dims:
        raise LayoutError(f"catalog= has dims {tuple(images.dims)}; its images need"
                          f" {STAMP_DIMS} (in any order).",
                          "rename its dims, e.g. catalog.rename({...}).")
    n = images.sizes["candidate"]
    ids = (images["candidate"].values if "candidate" in images.coords
           else np.arange(n, dtype=np.int64))
    ds = images.to_dataset(name="images")
    return ds.assign_coords(candidate_id=("candidate", ids))


def psf_of(catalog: xr.Dataset, model: Model, psf: Any) -> np.ndarray | da.Array | None:
    """The PSF ``model`` needs, checked against ``catalog``: ``(py, px)`` (numpy) for every
    candidate or ``(n, py, px)`` for each; None for a model without one. ``psf``: an array,
    a DataArray with dims ``(psf_y, psf_x)`` or ``(candidate, psf_y, psf_x)`` (any order),
    the path of a ``.npy`` or FITS file, or None for the catalog's own ``psf`` variable."""
    if isinstance(psf, str | PathLike):
        psf = load_psf(psf)
    if not model.needs_psf:
        if psf is not None:
            raise LayoutError(f"A psf was given, but model={model.name!r} does not use one.",
                              "drop psf=, or use model='psf'.")
        return None
    if psf is None:
        if "psf" not in catalog:
            raise LayoutError(
                "model='psf' needs a PSF; none was given and the catalog has no 'psf' variable.",
                "pass psf= as a (py, px) or (n, py, px) array, or store it in the catalog as "
                "psf(psf_y, psf_x) or psf(candidate, psf_y, psf_x).",
            )
        psf = catalog["psf"]
    if isinstance(psf, xr.DataArray):
        psf = _psf_array(psf)
    if not isinstance(psf, np.ndarray | da.Array):
        raise ArgumentError(f"psf= is a {type(psf).__name__}, not an array.",
                            "pass psf= as a (py, px) or (n, py, px) numpy array.")
    n = catalog.sizes["candidate"]
    if psf.ndim not in (2, 3) or (psf.ndim == 3 and psf.shape[0] != n):
        raise LayoutError(
            f"psf= has shape {tuple(psf.shape)}; expected (py, px) for every candidate or "
            f"({n}, py, px), one per candidate.",
            "pass one 2-D PSF stamp, or one per candidate stacked along the first axis.",
        )
    if min(psf.shape[-2:]) < 2 or psf.dtype.kind not in "fiu":
        raise LayoutError(
            f"psf= must be a real array of at least 2 x 2 pixels; it is {psf.dtype} "
            f"{tuple(psf.shape[-2:])}.",
            "pass a float PSF stamp such as outcore.fit.moffat_psf().",
        )
    if psf.ndim == 2:
        psf = np.asarray(psf, dtype=np.float64)
        if not (np.isfinite(psf).all() and psf.sum() > 0):
            raise LayoutError("The psf has non-finite values or a sum that is not positive.",
                              "pass a finite PSF stamp with a positive sum.")
    return psf


def _psf_array(psf: xr.DataArray) -> np.ndarray | da.Array:
    """A PSF DataArray's data, its dims ordered ``(candidate,) psf_y, psf_x``."""
    dims = set(map(str, psf.dims))
    for want in (PSF_DIMS[1:], PSF_DIMS):
        if dims == set(want):
            return psf.transpose(*want).data
    raise LayoutError(
        f"psf has dims {tuple(map(str, psf.dims))}; expected ('psf_y', 'psf_x') or "
        "('candidate', 'psf_y', 'psf_x').",
        "rename its dims, e.g. psf.rename({old: 'psf_y', ...}).",
    )
