"""The host twin of the fit's kernels (numpy): ``fit_chunk`` on a numpy chunk, and the
batched solve of its array code.

The models of ``COMPILED_MODELS`` run the compiled per-candidate loop of ``compiled`` (numba,
imported only where such a fit runs), which fits the same parameters, errors and statuses
as the array code to rounding (tested against it); the others, and every fit given
``compiled=False`` (a catalog too small to repay loading the loop: ``use_compiled``), run
the array code of ``arrays`` over blocks of ``HOST_BLOCK`` candidates. ``solve`` is numpy's
batched LU, which raises ``LinAlgError`` when a matrix of the batch cannot be factored; the
eigenvalues then decide which are singular (``arrays.flag_singular``).
"""

from __future__ import annotations

import functools

import numpy as np

from outcore.fit.kernels import arrays

#: Candidates whose model, Jacobian and start are computed at once on the host: few enough
#: for their scratch to stay in a core's cache and to not grow with the chunk.
HOST_BLOCK = 32
#: Models that numpy chunks fit with the compiled per-candidate loop of ``compiled`` (the
#: same algorithm, 4-6 times faster on one core); the others run the array code.
COMPILED_MODELS = ("gaussian",)
#: Stamp pixels of a whole catalog from which its fit loads the compiled loop: importing
#: numba and loading the loop from its cache cost a process about 0.8 CPU-s (measured under
#: load; about 0.5 s on a quiet core), and the loop saves about 0.6 CPU-us a stamp pixel over
#: the array code (0.16 ms a 17 x 17 stamp), so below about 2^20 pixels (3600 such stamps)
#: the array code finishes first.
COMPILED_FROM_PIXELS = 2**20


def use_compiled(model: str, candidates: int, stamp: tuple[int, int]) -> bool:
    """Whether a host fit of ``candidates`` stamps of ``stamp`` pixels runs the compiled
    loop: its model has one and the catalog has ``COMPILED_FROM_PIXELS`` stamp pixels or
    more. Decided for a whole catalog, so that every chunking fits it the same way."""
    return model in COMPILED_MODELS and candidates * stamp[0] * stamp[1] >= COMPILED_FROM_PIXELS


def fit_chunk(images: np.ndarray, variance: np.ndarray | None, mask: np.ndarray | None, *,
              model: str, psf: np.ndarray | None, max_iterations: int, f_tol: float,
              x_tol: float, g_tol: float, scale_errors: bool, compiled: bool = True
              ) -> np.ndarray:
    """``outcore.fit.kernels.fit_chunk`` on a numpy chunk: the packed ``(n, 2p + 4)``
    float64 result."""
    spec, out, rows, shared_psf = arrays.setup(images, variance, mask, model, psf)
    tols = (f_tol, x_tol, g_tol)
    if rows is not None and compiled and spec.name in COMPILED_MODELS:
        _fit_compiled(rows, out, images.shape[1:], max_iterations, tols)
    elif rows is not None:
        arrays.fit_batched(spec, rows, shared_psf, out, images.shape[1:], HOST_BLOCK, solve,
                           max_iterations, tols)
    return arrays.finish(out, spec, scale_errors)


def solve(m: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Solve ``m delta = g`` for each candidate, ``(k, p, p)`` and ``(k, p)``; flag the
    singular ones (their delta is 0).

    The system is Jacobi-scaled first (unit diagonal). A matrix with a non-positive or
    non-finite diagonal is singular; so is one LAPACK cannot factor, found by its eigenvalues
    only when the batched solve fails.
    """
    scaled, rhs, s, bad = arrays.jacobi_scaled(m, g)
    try:
        y = np.linalg.solve(scaled, rhs[:, :, None])[:, :, 0]
    except np.linalg.LinAlgError:
        y, bad = arrays.flag_singular(scaled, rhs, bad)
    return arrays.unscale(s, y, bad)


def _fit_compiled(rows: dict, out: np.ndarray, shape: tuple[int, int], max_iterations: int,
                  tols: tuple[float, float, float]) -> None:
    """The Gaussian model on the host: ``compiled``'s loop, one candidate at a time, the
    same algorithm as ``arrays.fit_batched``; then the same errors."""
    from outcore.fit.kernels import compiled  # numba, imported only where a host fit runs

    idx = rows["idx"]
    k, npar = idx.size, 8
    p = np.empty((k, npar))
    a = np.empty((k, npar, npar))
    cost, iters, status = np.empty(k), np.empty(k, np.int64), np.empty(k, np.int64)
    compiled.fit_gaussian(rows["data"], rows["sqrtw"], rows["valid"], shape[0], shape[1],
                          max_iterations, *tols, p, a, cost, iters, status)
    err = np.empty((k, npar))
    undecided = np.empty(k, dtype=bool)
    compiled.errors(a, err, undecided)
    singular = np.isnan(err).any(axis=1)
    if undecided.any():  # near-singular: the eigenvalues decide, as in arrays.errors
        err[undecided], singular[undecided] = arrays.errors(a[undecided], np)
    arrays.write(out, idx, p, err, singular, cost, iters, status)


@functools.cache
def warm() -> None:
    """Compile the host loop of ``COMPILED_MODELS`` in this process, or load it from numba's
    on-disk cache (``cache=True``), once per process: about 20 CPU seconds once per
    installation, then 1-3 s per process (mostly ``import numba``) and 150 MiB more resident
    memory (VmHWM 364 MiB instead of 211 MiB after a first fit, measured here). Calling it
    where a graph is built compiles the loop once per machine instead of in every worker at
    once."""
    stamps = np.zeros((1, 5, 5))
    stamps[0, 2, 1], stamps[0, 2, 3] = 1.0, -1.0
    fit_chunk(stamps, None, None, model="gaussian", psf=None, max_iterations=1, f_tol=1e-8,
              x_tol=1e-8, g_tol=1e-8, scale_errors=False)
