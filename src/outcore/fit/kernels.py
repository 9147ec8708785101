"""Batched Levenberg-Marquardt over the candidates of one chunk, on numpy or cupy.

``fit_chunk`` fits every candidate of a chunk at once: each iteration is a handful of array
operations over all candidates still running (no Python loop per candidate), and candidates
leave the working set as soon as they finish. Each candidate minimises its own
``chi2 = sum_pixels w (image - model)^2`` with ``w = 1 / variance`` (1 without a variance)
and ``w = 0`` on masked pixels; its result never depends on the other candidates of the chunk.

One iteration solves ``(A + lambda diag(D)) delta = g`` for every running candidate, with
``A = J^T W J``, ``g = J^T W r`` (``r`` the residual) and ``D`` the running maximum of
``diag(A)`` (Marquardt's scaling). A step that lowers chi2 is taken and ``lambda`` divided by
``LAMBDA_DOWN``; otherwise it is refused and ``lambda`` multiplied by ``LAMBDA_UP``. The
small per-candidate systems are solved in one batched call; the per-pixel work (models,
Jacobians, starts) runs over blocks of ``HOST_BLOCK`` candidates on the host, the whole
chunk at once on a GPU. On the host the models of ``COMPILED_MODELS`` run the same algorithm
as one compiled loop per candidate instead (``outcore.fit.cpu``, numba), which fits the same
parameters, errors and statuses to rounding (tested against this array code).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from outcore.backend import array_namespace
from outcore.fit.lm import (
    LAMBDA_DOWN,
    LAMBDA_RANGE,
    LAMBDA_START,
    LAMBDA_UP,
    SINGULAR_RCOND,
    STATUS,
    STATUS_NAMES,
)
from outcore.fit.models import Model, get_model

Array = Any

#: Candidates whose model, Jacobian and start are computed at once on the host (numpy):
#: few enough for their scratch to stay in a core's cache and to not grow with the chunk.
#: On a GPU (cupy) the whole chunk goes at once, in fewer and larger kernels.
HOST_BLOCK = 32
#: Models that numpy chunks fit with the compiled per-candidate loop of ``outcore.fit.cpu``
#: (the same algorithm, 4-6 times faster on one core); the others, and every cupy chunk, run
#: the array code below.
COMPILED_MODELS = ("gaussian",)


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
    positive sum); the rest of the chunk is fitted as usual.
    """
    xp = array_namespace(images)
    spec = get_model(model)
    if spec.needs_psf and psf is None:
        raise ValueError(f"model {model!r} needs a psf ((py, px) or (n, py, px)).")
    n, ny, nx = images.shape
    npar = len(spec.params)
    data, sqrtw, valid, npix = _prepare(images, variance, mask, xp)
    ok = ~_bad_candidates(images, variance, valid, psf, xp) & (npix >= npar)
    out = xp.full((n, 2 * npar + 4), xp.nan, dtype=xp.float64)
    out[:, 2 * npar + 1] = npix - npar
    out[:, 2 * npar + 2] = 0
    out[:, 2 * npar + 3] = STATUS["invalid_input"]
    idx = xp.nonzero(ok)[0]
    if idx.size == 0:
        return out
    if idx.size < n:
        data, sqrtw, valid = data[idx], sqrtw[idx], valid[idx]
        psf = psf[idx] if psf is not None and psf.ndim == 3 else psf
    if xp is np and spec.name in COMPILED_MODELS:
        _fit_on_host(data, sqrtw, valid, idx, out, (ny, nx), max_iterations,
                     (f_tol, x_tol, g_tol))
        return _finish(out, spec, npar, scale_errors, xp)
    block = HOST_BLOCK if xp is np else idx.size
    start = xp.concatenate([spec.start(data[part].reshape(-1, ny, nx),
                                       valid[part].reshape(-1, ny, nx))
                            for part in _blocks(None, idx.size, block)])
    del valid
    shared_psf = psf if psf is not None and psf.ndim == 2 else None
    buffer = xp.empty((min(block, idx.size), npar, ny, nx), dtype=xp.float64)
    problem = _Problem(spec, (ny, nx), block, shared_psf, buffer)
    state = {"idx": idx, "p": start, "data": data, "sqrtw": sqrtw}
    if psf is not None and psf.ndim == 3:
        state["psf"] = psf
    del data, sqrtw
    _levenberg_marquardt(problem, state, out, max_iterations, (f_tol, x_tol, g_tol))
    return _finish(out, spec, npar, scale_errors, xp)


def _finish(out: Array, spec: Model, npar: int, scale_errors: bool, xp: Any) -> Array:
    """The reported form of the parameters, and the errors scaled when asked."""
    out[:, :npar] = spec.canonical(out[:, :npar])
    if scale_errors:
        dof = out[:, 2 * npar + 1]
        scale = xp.sqrt(out[:, 2 * npar] / xp.where(dof > 0, dof, xp.nan))
        out[:, npar : 2 * npar] *= scale[:, None]
    return out


def _fit_on_host(data: np.ndarray, sqrtw: np.ndarray, valid: np.ndarray, idx: np.ndarray,
                 out: np.ndarray, shape: tuple[int, int], max_iterations: int,
                 tols: tuple[float, float, float]) -> None:
    """The Gaussian model on the host: ``outcore.fit.cpu``'s compiled loop, one candidate
    at a time, the same algorithm as ``_levenberg_marquardt``; then the same errors."""
    from outcore.fit import cpu  # numba, imported only where a host fit runs

    k, npar = idx.size, 8
    p = np.empty((k, npar))
    a = np.empty((k, npar, npar))
    cost, iters, status = np.empty(k), np.empty(k, np.int64), np.empty(k, np.int64)
    cpu.fit_gaussian(data, sqrtw, valid, shape[0], shape[1], max_iterations, *tols, p, a,
                     cost, iters, status)
    err = np.empty((k, npar))
    undecided = np.empty(k, dtype=bool)
    cpu.errors(a, err, undecided)
    singular = np.isnan(err).any(axis=1)
    if undecided.any():  # near-singular: the eigenvalues decide, as in _errors
        err[undecided], singular[undecided] = _errors(a[undecided], np)
    _write(out, idx, p, err, singular, cost, iters, status)


def _prepare(images: Array, variance: Array | None, mask: Array | None,
             xp: Any) -> tuple[Array, Array, Array, Array]:
    """Flat float64 data (0 where ignored), sqrt weights, valid pixels and their count per row.

    Each is one new array, whatever the input dtype (no float64 copy of the input first).
    """
    n = images.shape[0]
    flat = images.reshape(n, -1)
    valid = (xp.ones(flat.shape, dtype=bool) if mask is None
             else ~mask.reshape(n, -1).astype(bool, copy=False))
    data = flat.astype(xp.float64)
    data[~(valid & xp.isfinite(flat))] = 0.0
    if variance is None:
        return data, valid.astype(xp.float64), valid, valid.sum(axis=1)
    sqrtw = variance.reshape(n, -1).astype(xp.float64)
    good = valid & (sqrtw > 0) & xp.isfinite(sqrtw)
    sqrtw[~good] = 1.0
    xp.sqrt(sqrtw, out=sqrtw)
    xp.divide(1.0, sqrtw, out=sqrtw)
    sqrtw[~good] = 0.0
    return data, sqrtw, valid, valid.sum(axis=1)


def _bad_candidates(images: Array, variance: Array | None, valid: Array, psf: Array | None,
                    xp: Any) -> Array:
    """True for candidates with a non-finite pixel or a bad variance on an unmasked pixel, or
    (one PSF per candidate) a PSF that is not finite with a positive sum."""
    n = images.shape[0]
    bad = ~xp.isfinite(images.reshape(n, -1))
    if variance is not None:
        var = variance.reshape(n, -1)
        bad |= ~((var > 0) & xp.isfinite(var))
    bad = (bad & valid).any(axis=1)
    if psf is not None and psf.ndim == 3:
        flat = psf.reshape(n, -1)
        bad |= ~(xp.isfinite(flat).all(axis=1) & (flat.sum(axis=1) > 0))
    return bad


@dataclass(frozen=True)
class _Problem:
    """What stays fixed while a chunk is fitted: the model, the stamp shape, the block size
    of the per-pixel work, the PSF shared by all candidates (None when each has its own,
    kept with the running candidates' arrays) and the Jacobian's buffer.

    Reusing one buffer matters on Dask workers, whose allocator returns large blocks to the
    system at once (``MALLOC_TRIM_THRESHOLD_``): a new Jacobian per block would page-fault.
    """

    spec: Model
    shape: tuple[int, int]
    block: int
    psf: Array | None
    jacobian: Array  # (block, p, ny, nx) buffer, reused for every block's Jacobian

    def extra(self, state: dict, part: Array | slice) -> tuple:
        """The model's extra argument for the candidates ``part``: their PSF, or nothing."""
        if not self.spec.needs_psf:
            return ()
        return (state["psf"][part] if self.psf is None else self.psf,)


def _blocks(rows: Array | None, count: int, block: int) -> Iterator[Array | slice]:
    """Slices (``rows`` None) or index arrays (pieces of ``rows``) of ``block`` candidates."""
    for lo in range(0, count, block):
        yield slice(lo, lo + block) if rows is None else rows[lo : lo + block]


def _residual(problem: _Problem, state: dict, params: Array) -> tuple[Array, Array]:
    """Weighted residual ``sqrt(w) (data - model)`` of every candidate of ``state`` at
    ``params``, ``(k, ny * nx)``, and its chi2 ``(k,)``, computed block by block."""
    xp = array_namespace(params)
    k = params.shape[0]
    resid = xp.empty((k, math.prod(problem.shape)), dtype=xp.float64)
    chi2 = xp.empty(k, dtype=xp.float64)
    for part in _blocks(None, k, problem.block):
        model = problem.spec.evaluate(params[part], problem.shape, *problem.extra(state, part))
        r = resid[part]
        xp.subtract(state["data"][part], model.reshape(model.shape[0], -1), out=r)
        r *= state["sqrtw"][part]
        chi2[part] = (r * r).sum(axis=1)
        del model
    return resid, chi2


def _normal_equations(problem: _Problem, state: dict, rows: Array | None,
                      resid: Array) -> tuple[Array, Array]:
    """``A = J^T W J`` (k, p, p) and ``g = J^T W r`` (k, p) for the candidates ``rows`` of
    ``state`` (an index array; None for all), ``resid`` being the residual of all of them.
    The Jacobian is built one block at a time."""
    xp = array_namespace(resid)
    count = state["p"].shape[0] if rows is None else rows.shape[0]
    npar = state["p"].shape[1]
    a = xp.empty((count, npar, npar), dtype=xp.float64)
    g = xp.empty((count, npar), dtype=xp.float64)
    lo = 0
    for part in _blocks(rows, count, problem.block):
        params = state["p"][part]
        size = params.shape[0]
        jac = problem.spec.jacobian(params, problem.shape, *problem.extra(state, part),
                                    out=problem.jacobian[:size])
        jt = xp.moveaxis(jac, -1, 1).reshape(size, npar, -1)
        jt *= state["sqrtw"][part][:, None, :]
        a[lo : lo + size] = jt @ jt.transpose(0, 2, 1)
        g[lo : lo + size] = (jt @ resid[part][:, :, None])[:, :, 0]
        lo += size
    return a, g


def _diag(a: Array) -> Array:
    return a.diagonal(axis1=1, axis2=2)


def _levenberg_marquardt(problem: _Problem, state: dict, out: Array, max_iterations: int,
                         tols: tuple[float, float, float]) -> None:
    """Iterate every candidate of ``state`` to a status; write its row of ``out``.

    ``state`` maps names to arrays whose first axis is the running candidates: ``idx``
    (their rows of ``out``), ``p``, ``data``, ``sqrtw`` and their own ``psf`` if any; the
    loop adds ``cost``, ``a``, ``g``, ``d``, ``lam``, ``iters`` and ``status``, and drops the
    candidates that end.
    """
    xp = array_namespace(state["p"])
    f_tol, x_tol, g_tol = tols
    k, npar = state["p"].shape
    resid, state["cost"] = _residual(problem, state, state["p"])
    state["a"], state["g"] = _normal_equations(problem, state, None, resid)
    del resid
    state["d"] = _diag(state["a"]).copy()
    state["lam"] = xp.full(k, LAMBDA_START)
    state["iters"] = xp.zeros(k, dtype=xp.int64)
    state["status"] = xp.full(k, -1, dtype=xp.int64)
    diag = xp.arange(npar)
    while True:
        st = state["status"]
        st = xp.where((st < 0) & (_gradient_cosine(state) <= g_tol), STATUS["converged_g_tol"], st)
        st = xp.where((st < 0) & (state["iters"] >= max_iterations), STATUS["max_iterations"], st)
        state["status"] = st
        done = st >= 0
        if bool(done.any()):
            _retire(state, done, out)
            keep = ~done
            for key, value in state.items():  # in place: the caller's arrays are freed too
                state[key] = value[keep]
        if state["idx"].size == 0:
            return
        p, cost, a, g, d, lam = (state[key] for key in ("p", "cost", "a", "g", "d", "lam"))
        m = a.copy()
        m[:, diag, diag] += lam[:, None] * d
        delta, singular = _solve(m, g, xp)
        del m
        trial = p + delta
        resid, trial_cost = _residual(problem, state, trial)
        predicted = (delta * (g + lam[:, None] * d * delta)).sum(axis=1)
        actual = cost - trial_cost
        accept = (trial_cost < cost) & ~singular
        f_conv = (xp.abs(actual) <= f_tol * cost) & (predicted <= f_tol * cost)
        step = xp.sqrt((d * delta * delta).sum(axis=1))
        x_conv = step <= x_tol * (xp.sqrt((d * p * p).sum(axis=1)) + x_tol)
        state["iters"] = state["iters"] + 1
        st = xp.where(x_conv, STATUS["converged_x_tol"], -1)
        st = xp.where(f_conv, STATUS["converged_f_tol"], st)
        state["status"] = xp.where(singular, STATUS["singular"], st)
        state["p"] = xp.where(accept[:, None], trial, p)
        state["cost"] = xp.where(accept, trial_cost, cost)
        state["lam"] = xp.where(accept, xp.maximum(lam / LAMBDA_DOWN, LAMBDA_RANGE[0]),
                                xp.minimum(lam * LAMBDA_UP, LAMBDA_RANGE[1]))
        if bool(accept.all()):
            _update_accepted(problem, state, None, resid)
        elif bool(accept.any()):
            _update_accepted(problem, state, xp.nonzero(accept)[0], resid)
        del resid  # before the next compaction copies the running candidates' planes


def _update_accepted(problem: _Problem, state: dict, rows: Array | None, resid: Array) -> None:
    """Recompute ``A``, ``g`` and the scaling ``D`` of the candidates ``rows`` (None for all)
    whose step was taken; ``resid`` is the trial residual of every running candidate."""
    xp = array_namespace(resid)
    a, g = _normal_equations(problem, state, rows, resid)
    at = slice(None) if rows is None else rows
    state["a"][at] = a
    state["g"][at] = g
    state["d"][at] = xp.maximum(state["d"][at], _diag(a))


def _gradient_cosine(state: dict) -> Array:
    """Largest ``|g_j| / sqrt(A_jj chi2)`` per candidate: the cosine between the residual
    and each Jacobian column, MINPACK's scale-free gradient test (0 when ``g`` is 0)."""
    xp = array_namespace(state["g"])
    g = xp.abs(state["g"])
    denom = xp.sqrt(_diag(state["a"]) * state["cost"][:, None])
    cos = xp.where(denom > 0, g / xp.where(denom > 0, denom, 1.0), xp.where(g > 0, xp.inf, 0.0))
    return cos.max(axis=1)


def _solve(m: Array, g: Array, xp: Any) -> tuple[Array, Array]:
    """Solve ``m delta = g`` for each candidate; flag the singular ones (their delta is 0).

    The system is Jacobi-scaled first (unit diagonal). A matrix with a non-positive or
    non-finite diagonal is singular; so is one LAPACK cannot factor, found by its eigenvalues
    only when the batched solve fails.
    """
    npar = m.shape[-1]
    eye = xp.eye(npar, dtype=m.dtype)
    dg = _diag(m)
    bad = ~((dg > 0).all(axis=1) & xp.isfinite(m).all(axis=(1, 2)) & xp.isfinite(g).all(axis=1))
    s = 1.0 / xp.sqrt(xp.where(bad[:, None], 1.0, dg))
    scaled = xp.where(bad[:, None, None], eye, m * s[:, :, None] * s[:, None, :])
    rhs = xp.where(bad[:, None], 0.0, g * s)
    try:
        y = xp.linalg.solve(scaled, rhs[:, :, None])[:, :, 0]
    except np.linalg.LinAlgError:
        w = xp.linalg.eigvalsh(scaled)
        bad |= ~(w[:, 0] > SINGULAR_RCOND * w[:, -1])
        scaled = xp.where(bad[:, None, None], eye, scaled)
        y = xp.linalg.solve(scaled, xp.where(bad[:, None], 0.0, rhs)[:, :, None])[:, :, 0]
    delta = s * y
    bad |= ~xp.isfinite(delta).all(axis=1)
    return xp.where(bad[:, None], 0.0, delta), bad


def _errors(a: Array, xp: Any) -> tuple[Array, Array]:
    """Square roots of the diagonal of ``a^-1`` (k, p), NaN where ``a`` is singular, and that flag.

    Computed from the eigen-decomposition of the Jacobi-scaled matrix, which also gives its
    conditioning: ``(S a S)^-1 = V diag(1/w) V^T`` with ``S = diag(a)^-1/2``.
    """
    npar = a.shape[-1]
    dg = _diag(a)
    bad = ~((dg > 0).all(axis=1) & xp.isfinite(a).all(axis=(1, 2)))
    s = 1.0 / xp.sqrt(xp.where(bad[:, None], 1.0, dg))
    scaled = xp.where(bad[:, None, None], xp.eye(npar), a * s[:, :, None] * s[:, None, :])
    w, v = xp.linalg.eigh(scaled)
    bad |= ~(w[:, 0] > SINGULAR_RCOND * w[:, -1])
    w = xp.where(bad[:, None], 1.0, w)
    err = s * xp.sqrt((v * v / w[:, None, :]).sum(axis=2))
    return xp.where(bad[:, None], xp.nan, err), bad


def _retire(state: dict, done: Array, out: Array) -> None:
    """Write the finished candidates' rows of ``out``: parameters, errors, chi2, counts."""
    err, singular = _errors(state["a"][done], array_namespace(done))
    _write(out, state["idx"][done], state["p"][done], err, singular, state["cost"][done],
           state["iters"][done], state["status"][done])


def _write(out: Array, rows: Array, p: Array, err: Array, singular: Array, cost: Array,
           iters: Array, status: Array) -> None:
    """Rows ``rows`` of ``out``: parameters, errors, chi2, iterations and the status
    (``singular`` where the normal matrix at the solution is)."""
    xp = array_namespace(p)
    npar = p.shape[1]
    out[rows, :npar] = p
    out[rows, npar : 2 * npar] = err
    out[rows, 2 * npar] = cost
    out[rows, 2 * npar + 2] = iters
    out[rows, 2 * npar + 3] = xp.where(singular, STATUS["singular"], status)


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
    fit_chunk(stamps, max_iterations=1)
