"""``fit_dipoles``: the lazy graph that fits every candidate of a cutout catalog, chunk by chunk.

The catalog is rechunked to ``chunk_size`` whole stamps per chunk and ``fit_chunk`` is mapped
over the chunks; each task holds one chunk, so memory per worker is bounded by the chunk size
whatever the catalog's size (``outcore.fit.memory`` gives the bytes). ``plan_fit_dipoles``
makes the plan of a fit for a cluster's workers, computing nothing; ``fit_dipoles`` checks it
against the cluster it runs on before it returns the graph. Nothing is computed until the
caller asks; whole-catalog problems and a plan that cannot fit are refused before that, with
a fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from os import PathLike
from typing import TYPE_CHECKING, Any

import dask
import dask.array as da
import numpy as np
import xarray as xr

from outcore import backend as backends
from outcore import session
from outcore.arguments import keywords_checked
from outcore.checks import at_least, choice
from outcore.errors import ArgumentError, LayoutError, OutcoreError
from outcore.fit.inputs import catalog_of, psf_of
from outcore.fit.kernels import fit_chunk, fit_columns, status_names, warm
from outcore.fit.kernels.cpu import use_compiled
from outcore.fit.kernels.lm import STATUS_NAMES
from outcore.fit.memory import FIT_WORKER_BASELINE_BYTES, auto_chunk_size, memory_model
from outcore.fit.models import MODELS, Model, get_model
from outcore.plan import WORKER_BASELINE_BYTES, Plan, Resources

if TYPE_CHECKING:
    import distributed

__all__ = ["fit_dipoles", "plan_fit_dipoles", "status_counts"]

Catalog = xr.Dataset | xr.DataArray | str | PathLike
PSF = np.ndarray | xr.DataArray | str | PathLike | None

#: Units of the parameters: pixels, and the images' own ``units`` (else "image unit").
_UNITS = {"x_pos": "pixel", "y_pos": "pixel", "x_neg": "pixel", "y_neg": "pixel",
          "sigma": "pixel", "flux_pos": "{} x pixel^2", "flux_neg": "{} x pixel^2",
          "background": "{}"}
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


@dataclass(frozen=True)
class _Fit:
    """The checked arguments of a fit: the catalog (stamps ``(candidate, y, x)``), the model,
    its PSF (``(py, px)`` numpy or ``(n, py, px)``), the resolved chunk sizes and backend,
    and the kernel's options."""

    catalog: xr.Dataset
    spec: Model
    psf: np.ndarray | da.Array | None
    chunk_size: int
    output_chunk: int
    backend: str
    options: dict[str, Any]

    @property
    def stamp(self) -> tuple[int, int]:
        return self.catalog.sizes["y"], self.catalog.sizes["x"]

    def plan(self, resources: Resources) -> Plan:
        """The plan of this fit on ``resources`` (nothing computed): a fit task per chunk,
        the columns it splits into, and the baseline of a worker that fits (numba's compiled
        loop where the fit runs it, ``compiled``). Its config records the chunk size and
        whether the compiled loop runs."""
        catalog, n = self.catalog, self.catalog.sizes["candidate"]
        stages = memory_model(
            n, self.chunk_size, self.stamp, catalog["images"].dtype, self.spec.name,
            variance="variance" in catalog, mask="mask" in catalog,
            psf_shape=None if self.psf is None else tuple(self.psf.shape[-2:]),
            per_candidate_psf=self.psf is not None and self.psf.ndim == 3,
            backend=self.backend, output_chunk=self.output_chunk)
        return Plan.of(stages, resources, config={"chunk_size": self.chunk_size,
                                                  "compiled_loop": self.compiled},
                       baseline_bytes=FIT_WORKER_BASELINE_BYTES if self.compiled
                       else WORKER_BASELINE_BYTES)

    @property
    def compiled(self) -> bool:
        """Whether the fit runs numba's compiled loop: on the host, for a model that has
        one, on a catalog large enough to repay loading it (``cpu.use_compiled``)."""
        return self.backend == "numpy" and self.options["compiled"]

    @property
    def fixes(self) -> list[str]:
        """What shrinks the fit's tasks, named when its plan does not fit."""
        return [f"use a smaller chunk_size= (each task fits {self.chunk_size} stamps now)"]


def _checked(catalog: Catalog, model: str, psf: PSF, chunk_size: int | None, backend: str,
             max_iterations: int, f_tol: float, x_tol: float, g_tol: float,
             scale_errors: bool, output_chunk: int | None) -> _Fit:
    """The arguments of ``fit_dipoles`` checked (reading no pixel), one ``OutcoreError``
    naming the first that is wrong."""
    choice(model, sorted(MODELS), "model")
    at_least(chunk_size, "chunk_size", error=LayoutError)
    at_least(output_chunk, "output_chunk", error=LayoutError)
    at_least(max_iterations, "max_iterations", error=LayoutError)
    for name, tol in (("f_tol", f_tol), ("x_tol", x_tol), ("g_tol", g_tol)):
        if isinstance(tol, bool) or not isinstance(tol, int | float) or not tol >= 0:
            raise OutcoreError(f"{name}={tol!r} is not a tolerance (a number of 0 or more).",
                               f"give {name}=1e-8 or another small number.")
    if not isinstance(scale_errors, bool | np.bool_):
        raise ArgumentError(f"scale_errors={scale_errors!r} is not True or False.",
                            "give scale_errors=True or scale_errors=False.")
    resolved = backends.resolve(backend)
    cat = catalog_of(catalog)
    spec = get_model(model)
    n = cat.sizes["candidate"]
    chunk = chunk_size or auto_chunk_size(n, (cat.sizes["y"], cat.sizes["x"]))
    options = {"model": model, "max_iterations": max_iterations, "f_tol": f_tol,
               "x_tol": x_tol, "g_tol": g_tol, "scale_errors": bool(scale_errors),
               "compiled": use_compiled(model, n, (cat.sizes["y"], cat.sizes["x"]))}
    return _Fit(cat, spec, psf_of(cat, spec, psf), chunk, output_chunk or chunk, resolved,
                options)


@keywords_checked
def plan_fit_dipoles(
    catalog: Catalog,
    *,
    model: str = "gaussian",
    psf: PSF = None,
    chunk_size: int | None = None,
    backend: str = "numpy",
    max_iterations: int = 100,
    f_tol: float = 1e-8,
    x_tol: float = 1e-8,
    g_tol: float = 1e-8,
    scale_errors: bool = False,
    output_chunk: int | None = None,
    client: distributed.Client | None = None,
    resources: Resources | None = None,
) -> Plan:
    """The memory plan of ``fit_dipoles(catalog, ...)`` with the same arguments, computing
    nothing: the bytes of each kind of task against the workers of ``client`` (default: the
    running client, see ``fit_dipoles``) or the given ``resources``. ``print(plan.table())``
    shows it; ``plan.fits`` says whether it fits (``fit_dipoles`` refuses one that does not)."""
    fit = _checked(catalog, model, psf, chunk_size, backend, max_iterations, f_tol, x_tol,
                   g_tol, scale_errors, output_chunk)
    if resources is None:
        resources = session.resources_for(session.client_for(client), fit.backend)
    return fit.plan(resources)


@keywords_checked
def fit_dipoles(
    catalog: Catalog,
    *,
    model: str = "gaussian",
    psf: PSF = None,
    chunk_size: int | None = None,
    backend: str = "numpy",
    max_iterations: int = 100,
    f_tol: float = 1e-8,
    x_tol: float = 1e-8,
    g_tol: float = 1e-8,
    scale_errors: bool = False,
    output_chunk: int | None = None,
    client: distributed.Client | None = None,
    plan: Plan | None = None,
) -> xr.Dataset:
    """Fit a dipole model to every cutout of ``catalog``; return a lazy Dataset of the fits.

    ``catalog``: a Dataset in the ``cutouts`` layout, ``images(candidate, y, x)`` (any dim
    order: it is reordered), optional ``variance`` and ``mask`` (True = ignored) of the same
    dims, ``candidate_id(candidate)``; or a DataArray of images (ids from its ``candidate``
    coordinate, else 0..n-1); or the path of a store or an NPZ file. ``model`` is
    ``"gaussian"`` or ``"psf"``; the PSF model takes ``psf`` as a ``(py, px)`` array for
    every candidate or ``(n, py, px)`` for each (or a ``.npy``/FITS path), or else the
    catalog's ``psf`` variable with dims ``(psf_y, psf_x)`` or ``(candidate, psf_y,
    psf_x)``. ``chunk_size``: candidates a task fits (default: a power of two up to 4096, at
    least 8 tasks, at most 16 MiB of stamps a task). ``backend`` (``numpy``, ``cupy`` or
    ``auto``) runs each chunk on the host or the GPU. The tolerances and ``max_iterations``
    are those of ``outcore.fit.fit_chunk``.

    Runs on ``client``, else the Dask client you started (``distributed.Client(...)``), else
    a cluster of this process started once: the plan (``plan_fit_dipoles``) is made for its
    workers and a plan that does not fit their memory is one ``PlanError`` before any task
    runs, naming ``chunk_size=`` and ``memory_limit=``. ``plan``: a plan already made and
    checked (the command line's), used as it is.

    The result is indexed by ``candidate`` with coordinate ``candidate_id``: each parameter
    (positions and ``sigma`` in pixels from the stamp centre, fluxes in image units times
    pixels, ``units`` attrs) and its ``<name>_err``, ``chi2``, ``dof``, ``iterations`` and
    ``status`` (a string, one of ``STATUS_NAMES``), all dask-backed, nothing computed,
    ``output_chunk`` candidates a chunk (default ``chunk_size``). Bad input is one
    ``OutcoreError`` before any compute.
    """
    fit = _checked(catalog, model, psf, chunk_size, backend, max_iterations, f_tol, x_tol,
                   g_tol, scale_errors, output_chunk)
    session.fitted_plan(fit.plan, client, fit.backend, plan=plan, fixes=fit.fixes)
    return _graph(fit)


def _graph(fit: _Fit) -> xr.Dataset:
    """The lazy Dataset of the fits of ``fit``'s catalog."""
    catalog, chunk_size, model = fit.catalog, fit.chunk_size, fit.spec.name
    names = ["images"] + [name for name in ("variance", "mask") if name in catalog]
    blocks = [_by_candidate(catalog[name].data, chunk_size) for name in names]
    shared_psf = None
    if fit.psf is not None and fit.psf.ndim == 3:
        names.append("psf")
        blocks.append(_by_candidate(fit.psf, chunk_size))
    elif fit.psf is not None:
        shared_psf = np.asarray(fit.psf, dtype=np.float64)
    if fit.compiled:  # compile here once, so that workers load the loop from numba's cache
        warm(fit.backend, model)
    columns = fit_columns(model)
    packed = da.map_blocks(
        _fit_block, *blocks, names=tuple(names), psf=shared_psf, backend=fit.backend,
        options=fit.options, drop_axis=2, chunks=(blocks[0].chunks[0], (len(columns),)),
        dtype=np.float64, meta=np.empty((0, 0), dtype=np.float64),
    )
    rows = fit.output_chunk
    if rows != chunk_size:  # one concatenation per output chunk, then its columns
        packed = packed.rechunk((rows, -1))
    dims = ("candidate",)
    image_unit = str(catalog["images"].attrs.get("units", "image unit"))
    data = {}
    for j, name in enumerate(columns):
        column = packed[:, j]
        if name == "status":
            column = column.map_blocks(status_names, dtype=f"<U{max(map(len, STATUS_NAMES))}")
        elif name in ("dof", "iterations"):
            column = column.astype(np.int64)
        base = name.removesuffix("_err")
        doc = _DOCS[base] if base == name else f"1-sigma error of {base} from the covariance"
        attrs = {"long_name": doc}
        if base in _UNITS:
            attrs["units"] = _UNITS[base].format(image_unit)
        data[name] = xr.Variable(dims, column, attrs=attrs)
    ids = catalog["candidate_id"].variable
    coords = {"candidate_id": ids.chunk({"candidate": rows}) if ids.chunks else ids}
    if "candidate" in catalog.coords:
        coords["candidate"] = catalog["candidate"].variable
    attrs = {"outcore_operator": "fit-dipoles", "model": model,
             "parameters": list(fit.spec.params), "status_values": list(STATUS_NAMES),
             "errors_scaled_by_reduced_chi2": fit.options["scale_errors"],
             **{k: fit.options[k] for k in ("max_iterations", "f_tol", "x_tol", "g_tol")}}
    return xr.Dataset(data, coords=coords, attrs=attrs)


@keywords_checked
def status_counts(result: xr.Dataset) -> dict[str, int]:
    """How many fits of ``result`` (``fit_dipoles``'s, or a store of them opened with
    ``xr.open_zarr``) ended with each status, in ``STATUS_NAMES`` order.

    One pass over the status column (computed per chunk on the running scheduler when it is
    dask-backed).
    """
    if not isinstance(result, xr.Dataset) or "status" not in result.data_vars:
        raise ArgumentError(f"result= is a {type(result).__name__} without a status variable,"
                            " not the fits of fit_dipoles.",
                            "pass the Dataset fit_dipoles returns (or its store, opened).")
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
