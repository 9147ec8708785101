"""The fit's kernels: batched Levenberg-Marquardt over the candidates of one chunk, on numpy
or cupy.

``fit_chunk`` fits every candidate of a chunk at once and dispatches on the chunk's array
(``backend.kernels``): numpy runs ``cpu.py`` (the compiled per-candidate loop of
``compiled.py`` for ``cpu.COMPILED_MODELS``, numba; the array code for the others), cupy
runs ``gpu.py`` (the array code on the device, with its own singular flagging). Both twins
share the array code of ``arrays.py`` (written once against the chunk's namespace) and the
rules of ``lm.py`` (status codes, damping, the singularity threshold); their results agree
to rounding (``tests/test_fit_kernels.py``). ``fit_columns`` and ``unpack`` name the packed
result's columns, ``status_names`` its status codes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from outcore.backend import kernels
from outcore.fit.kernels.lm import STATUS_NAMES
from outcore.fit.models import get_model

Array = Any


def fit_columns(model: str) -> tuple[str, ...]:
    """Names of the columns of ``fit_chunk``'s packed output for ``model``."""
    params = get_model(model).params
    return (*params, *(f"{p}_err" for p in params), "chi2", "dof", "iterations", "status")


def unpack(packed: Array, model: str) -> dict[str, Array]:
    """Split a packed ``(n, k)`` result into named columns (dof, iterations, status as ints)."""
    out = dict(zip(fit_columns(model), packed.T, strict=True))
    for name in ("dof", "iterations", "status"):
        out[name] = out[name].astype("int64")
    return out


def status_names(codes: Array) -> np.ndarray:
    """Status names (numpy strings) of an array of status codes."""
    return np.asarray(STATUS_NAMES)[np.asarray(codes, dtype=np.int64)]


def fit_chunk(
    images: Array,
    variance: Array | None = None,
    mask: Array | None = None,
    *,
    model: str = "gaussian",
    psf: Array | None = None,
    max_iterations: int = 100,
    f_tol: float = 1e-8,
    x_tol: float = 1e-8,
    g_tol: float = 1e-8,
    scale_errors: bool = False,
    compiled: bool = True,
) -> Array:
    """Fit a dipole model to every stamp of a chunk; return a packed ``(n, 2p + 4)`` float64.

    ``images``, ``variance`` and ``mask`` (True = ignored) are ``(n, ny, nx)`` numpy or cupy
    arrays; the result is in the same namespace, its columns named by ``fit_columns(model)``:
    the ``p`` parameters, their errors (square root of the diagonal of ``(J^T W J)^-1`` at the
    solution, multiplied by ``sqrt(chi2 / dof)`` only with ``scale_errors``), chi2, dof
    (unmasked pixels minus ``p``), iterations (trial steps) and the status code (see
    ``STATUS_NAMES``; ``unpack`` splits the columns). ``psf`` is ``(py, px)`` or
    ``(n, py, px)`` for ``model="psf"``. A candidate with a non-finite pixel, a non-positive
    or non-finite variance on an unmasked pixel, or fewer unmasked pixels than parameters is
    ``invalid_input`` with NaN parameters (so is one whose own PSF is not finite with a
    positive sum); the rest of the chunk is fitted as usual. ``compiled=False`` fits a
    numpy chunk with the array code even where numba's compiled loop would run (the same
    fits to rounding, without importing numba).
    """
    return kernels(images, __name__).fit_chunk(
        images, variance, mask, model=model, psf=psf, max_iterations=max_iterations,
        f_tol=f_tol, x_tol=x_tol, g_tol=g_tol, scale_errors=scale_errors, compiled=compiled)


def warm(backend: str, model: str) -> None:
    """Ready this process for chunks of ``model`` on ``backend``: on the host, the models of
    ``cpu.COMPILED_MODELS`` get their compiled loop compiled here or loaded from numba's
    cache, once per process (``cpu.warm``); nothing else needs it."""
    from outcore.fit.kernels import cpu

    if backend == "numpy" and model in cpu.COMPILED_MODELS:
        cpu.warm()
