"""``fit_dipoles``: the lazy graph that fits every candidate of a cutout catalog, chunk by chunk.

The catalog is rechunked to ``chunk_size`` whole stamps per chunk and ``fit_chunk`` is mapped
over the chunks; each task holds one chunk, so memory per worker is bounded by the chunk size
whatever the catalog's size (``outcore.fit.memory`` gives the bytes). Nothing is computed
until the caller asks; whole-catalog problems are refused before that, with a fix.
"""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import xarray as xr

from outcore import backend as backends
from outcore.checks import at_least
from outcore.errors import LayoutError
from outcore.fit.kernels import fit_chunk, fit_columns, status_names, warm
from outcore.fit.kernels.lm import STATUS_NAMES
from outcore.fit.models import Model, get_model
from outcore.io.layouts import validate

_UNITS = {"x_pos": "pixel", "y_pos": "pixel", "x_neg": "pixel", "y_neg": "pixel",
          "sigma": "pixel", "flux_pos": "image unit x pixel^2", "flux_neg": "image unit x pixel^2",
          "background": "image unit"}
_DOCS = {
    "x_pos": "x of the positive lobe from the stamp centre (last axis)",
    "y_pos": "y of the positive lobe from the stamp centre",
    "x_neg": "x of the negative lobe from the stamp centre (last axis)",
    "y_neg": "y of the negative lobe from the stamp centre",
    "flux_pos": "integral of the positive lobe",
    "flux_neg": "integral of the negative lobe (negative for a dipole)",
    "sigma": "width of both Gaussian lobes",
    "background": "constant background level",
    "chi2": "sum over unmasked pixels of (image - model)^2 / variance at the solution",
    "dof": "unmasked pixels minus fitted parameters",
    "iterations": "Levenberg-Marquardt trial steps",
    "status": "how the fit ended: " + ", ".join(STATUS_NAMES),
}


def fit_dipoles(
    catalog: xr.Dataset,
    *,
    model: str = "gaussian",
    psf: np.ndarray | xr.DataArray | None = None,
    chunk_size: int = 256,
    backend: str = "numpy",
    max_iterations: int = 100,
    f_tol: float = 1e-8,
    x_tol: float = 1e-8,
    g_tol: float = 1e-8,
    scale_errors: bool = False,
    output_chunk: int | None = None,
) -> xr.Dataset:
    """Fit a dipole model to every cutout of ``catalog``; return a lazy Dataset of the fits.

    ``catalog`` is in the ``cutouts`` layout: ``images(candidate, y, x)``, optional
    ``variance`` and ``mask`` (True = ignored) of the same dims, ``candidate_id(candidate)``.
    ``model`` is ``"gaussian"`` or ``"psf"``; the PSF model takes ``psf`` as a ``(py, px)``
    array for every candidate or ``(n, py, px)`` for each, or else the catalog's ``psf``
    variable with dims ``(psf_y, psf_x)`` or ``(candidate, psf_y, psf_x)``. ``backend``
    (``numpy``, ``cupy`` or ``auto``) runs each chunk on the host or the GPU. The tolerances
    and ``max_iterations`` are those of ``outcore.fit.kernels.fit_chunk``.

    The result is indexed by ``candidate`` with coordinate ``candidate_id``: each parameter
    and its ``<name>_err``, ``chi2``, ``dof``, ``iterations`` and ``status`` (a string, one of
    ``STATUS_NAMES``), all dask-backed, ``output_chunk`` candidates a chunk (default
    ``chunk_size``: a writer asks for storage-sized chunks, e.g. 65536 rows, while each fit
    task still takes ``chunk_size`` candidates). Raises LayoutError before any compute when
    the catalog or the PSF does not fit.
    """
    spec = get_model(model)
    at_least(chunk_size, "chunk_size", error=LayoutError)
    at_least(output_chunk, "output_chunk", error=LayoutError)
    resolved = backends.resolve(backend)
    validate(catalog, "cutouts")
    n = catalog.sizes["candidate"]
    if n == 0:
        raise LayoutError("The catalog has no candidates.", "pass a catalog with at least one.")
    psf_value = _resolve_psf(catalog, spec, psf)
    names = ["images"] + [name for name in ("variance", "mask") if name in catalog]
    blocks = [_by_candidate(catalog[name].data, chunk_size) for name in names]
    shared_psf = None
    if psf_value is not None and psf_value.ndim == 3:
        names.append("psf")
        blocks.append(_by_candidate(psf_value, chunk_size))
    elif psf_value is not None:
        shared_psf = np.asarray(psf_value, dtype=np.float64)
    warm(resolved, model)  # compile here once, so that workers load the loop from numba's cache
    columns = fit_columns(model)
    options = {"model": model, "max_iterations": max_iterations, "f_tol": f_tol, "x_tol": x_tol,
               "g_tol": g_tol, "scale_errors": scale_errors}
    packed = da.map_blocks(
        _fit_block, *blocks, names=tuple(names), psf=shared_psf, backend=resolved,
        options=options, drop_axis=2, chunks=(blocks[0].chunks[0], (len(columns),)),
        dtype=np.float64, meta=np.empty((0, 0), dtype=np.float64),
    )
    rows = output_chunk or chunk_size
    if rows != chunk_size:  # one concatenation per output chunk, then its columns
        packed = packed.rechunk((rows, -1))
    dims = ("candidate",)
    data = {}
    for j, name in enumerate(columns):
        column = packed[:, j]
        if name == "status":
            column = column.map_blocks(status_names, dtype=f"<U{max(map(len, STATUS_NAMES))}")
        elif name in ("dof", "iterations"):
            column = column.astype(np.int64)
        base = name.removesuffix("_err")
        doc = _DOCS[base] if base == name else f"1-sigma error of {base} from the covariance"
        attrs = {"long_name": doc} | ({"units": _UNITS[base]} if base in _UNITS else {})
        data[name] = xr.Variable(dims, column, attrs=attrs)
    ids = catalog["candidate_id"].variable
    coords = {"candidate_id": ids.chunk({"candidate": rows}) if ids.chunks else ids}
    if "candidate" in catalog.coords:
        coords["candidate"] = catalog["candidate"].variable
    attrs = {"outcore_operator": "fit-dipoles", "model": model, "parameters": list(spec.params),
             "status_values": list(STATUS_NAMES), "errors_scaled_by_reduced_chi2": scale_errors,
             "max_iterations": max_iterations, "f_tol": f_tol, "x_tol": x_tol, "g_tol": g_tol}
    return xr.Dataset(data, coords=coords, attrs=attrs)


def status_counts(result: xr.Dataset) -> dict[str, int]:
    """How many fits of ``result`` ended with each status, in ``STATUS_NAMES`` order.

    One pass over the status column (computed lazily per chunk when it is dask-backed).
    """
    counts = dask.compute(*[(result["status"] == name).sum().data for name in STATUS_NAMES])
    return {name: int(count) for name, count in zip(STATUS_NAMES, counts, strict=True)}


def _fit_block(*blocks: np.ndarray, names: tuple[str, ...], psf: np.ndarray | None,
               backend: str, options: dict) -> np.ndarray:
    """``fit_chunk`` on one chunk, moved to the backend's device and its result back."""
    arrays = {name: backends.to_backend(block, backend) for name, block in zip(names, blocks,
                                                                               strict=True)}
    if psf is not None:
        arrays["psf"] = backends.to_backend(psf, backend)
    return backends.to_host(fit_chunk(**arrays, **options))


def _by_candidate(array: np.ndarray | da.Array, chunk_size: int) -> da.Array:
    """A dask array with ``chunk_size`` candidates (axis 0) a chunk and whole stamps."""
    chunks = (chunk_size,) + (-1,) * (array.ndim - 1)
    if isinstance(array, da.Array):
        return array.rechunk(chunks)
    return da.from_array(array, chunks=chunks)


def _resolve_psf(catalog: xr.Dataset, spec: Model,
                 psf: np.ndarray | xr.DataArray | None) -> np.ndarray | da.Array | None:
    """The PSF the model needs, checked: ``(py, px)`` (numpy) or ``(n, py, px)``, else None."""
    if not spec.needs_psf:
        if psf is not None:
            raise LayoutError(f"A psf was given, but model {spec.name!r} does not use one.",
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
        dims = tuple(map(str, psf.dims))
        if dims not in (("psf_y", "psf_x"), ("candidate", "psf_y", "psf_x")):
            raise LayoutError(
                f"psf has dims {dims}; expected ('psf_y', 'psf_x') or "
                "('candidate', 'psf_y', 'psf_x').",
                "rename its dims, e.g. psf.rename({old: 'psf_y', ...}).",
            )
        psf = psf.data
    n = catalog.sizes["candidate"]
    if psf.ndim not in (2, 3) or (psf.ndim == 3 and psf.shape[0] != n):
        raise LayoutError(
            f"psf has shape {tuple(psf.shape)}; expected (py, px) for every candidate or "
            f"({n}, py, px), one per candidate.",
            "pass one 2-D PSF stamp, or one per candidate stacked along the first axis.",
        )
    if min(psf.shape[-2:]) < 2 or psf.dtype.kind not in "fiu":
        raise LayoutError(
            f"psf must be a real array of at least 2 x 2 pixels; it is {psf.dtype} "
            f"{tuple(psf.shape[-2:])}.",
            "pass a float PSF stamp such as outcore.fit.simulate.moffat_psf().",
        )
    if psf.ndim == 2:
        psf = np.asarray(psf, dtype=np.float64)
        if not (np.isfinite(psf).all() and psf.sum() > 0):
            raise LayoutError("The psf has non-finite values or a sum that is not positive.",
                              "pass a finite PSF stamp with a positive sum.")
    return psf
