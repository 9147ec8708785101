"""The batched Levenberg-Marquardt array code over the candidates of one chunk, written once
against the chunk's namespace (numpy or cupy) and run by both twins.

Each iteration is a handful of array operations over all candidates still running (no
Python loop per candidate), and candidates leave the working set as soon as they finish.
Each candidate minimises its own ``chi2 = sum_pixels w (image - model)^2`` with
``w = 1 / variance`` (1 without a variance) and ``w = 0`` on masked pixels; its result never
depends on the other candidates of the chunk.

One iteration solves ``(A + lambda diag(D)) delta = g`` for every running candidate, with
``A = J^T W J``, ``g = J^T W r`` (``r`` the residual) and ``D`` the running maximum of
``diag(A)`` (Marquardt's scaling). A step that lowers chi2 is taken and ``lambda`` divided by
``LAMBDA_DOWN``; otherwise it is refused and ``lambda`` multiplied by ``LAMBDA_UP``. The
small per-candidate systems are solved in one batched call by the twin's ``solve`` (the
Jacobi scaling and the eigenvalue test are here, ``jacobi_scaled`` and ``flag_singular``);
the per-pixel work (models, Jacobians, starts) runs over blocks of candidates whose size the
twin gives (``cpu.HOST_BLOCK`` on the host, the whole chunk on a GPU).

``setup`` checks a chunk and fills in its invalid candidates, ``fit_batched`` fits the rest,
``finish`` gives the reported form; ``cpu.py`` and ``gpu.py`` put them together.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from outcore.backend import array_namespace
from outcore.fit.kernels.lm import (
    LAMBDA_DOWN,
    LAMBDA_RANGE,
    LAMBDA_START,
    LAMBDA_UP,
    SINGULAR_RCOND,
    STATUS,
)
from outcore.fit.models import Model, get_model

Array = Any
#: A twin's batched solve: ``(m (k, p, p), g (k, p)) -> (delta (k, p), singular (k,))``.
Solve = Callable[[Array, Array], tuple[Array, Array]]


def setup(images: Array, variance: Array | None, mask: Array | None, model: str,
          psf: Array | None) -> tuple[Model, Array, dict | None, Array | None]:
    """A chunk checked and prepared: the model, the packed output ``(n, 2p + 4)`` with every
    row ``invalid_input`` (NaN, with its dof and no iterations), and the candidates to fit.

    Those are a dict of arrays whose first axis is the valid candidates: ``idx`` (their rows
    of the output), ``data`` (float64, 0 where ignored), ``sqrtw`` (``sqrt(1 / variance)``,
    0 where ignored), ``valid`` (the pixels that count), each ``(k, ny * nx)``, and ``psf``
    when each candidate has its own; None when no candidate is valid. The last item is the
    PSF all candidates share (None when each has its own, or for a model without one). The
    callers hand the dict on and keep no other reference, so that the fit frees the arrays
    of the candidates that end (``fit_batched``).
    """
    xp = array_namespace(images)
    spec = get_model(model)
    if spec.needs_psf and psf is None:
        raise ValueError(f"model {model!r} needs a psf ((py, px) or (n, py, px)).")
    n = images.shape[0]
    npar = len(spec.params)
    data, sqrtw, valid, npix = _prepare(images, variance, mask, xp)
    ok = ~_bad_candidates(images, variance, valid, psf, xp) & (npix >= npar)
    out = xp.full((n, 2 * npar + 4), xp.nan, dtype=xp.float64)
    out[:, 2 * npar + 1] = npix - npar
    out[:, 2 * npar + 2] = 0
    out[:, 2 * npar + 3] = STATUS["invalid_input"]
    idx = xp.nonzero(ok)[0]
    shared_psf = psf if psf is not None and psf.ndim == 2 else None
    if idx.size == 0:
        return spec, out, None, shared_psf
    if idx.size < n:
        data, sqrtw, valid = data[idx], sqrtw[idx], valid[idx]
        psf = psf[idx] if psf is not None and psf.ndim == 3 else psf
    rows = {"idx": idx, "data": data, "sqrtw": sqrtw, "valid": valid}
    if psf is not None and psf.ndim == 3:
        rows["psf"] = psf
    return spec, out, rows, shared_psf


def fit_batched(spec: Model, rows: dict, shared_psf: Array | None, out: Array,
                shape: tuple[int, int], block: int, solve: Solve, max_iterations: int,
                tols: tuple[float, float, float]) -> None:
    """Fit the candidates ``rows`` of ``setup`` with the batched array code and write their
    rows of ``out``: the start, then Levenberg-Marquardt, ``block`` candidates at a time
    for the per-pixel work, each step's systems solved by ``solve``. ``rows`` is consumed:
    its ``valid`` is dropped once the start is made, and its arrays shrink as candidates
    end."""
    xp = array_namespace(rows["data"])
    ny, nx = shape
    npar = len(spec.params)
    count = rows["idx"].size
    data, valid = rows["data"], rows["valid"]
    start = xp.concatenate([spec.start(data[part].reshape(-1, ny, nx),
                                       valid[part].reshape(-1, ny, nx))
                            for part in _blocks(None, count, block)])
    del data, valid, rows["valid"]
    buffer = xp.empty((min(block, count), npar, ny, nx), dtype=xp.float64)
    problem = _Problem(spec, (ny, nx), block, shared_psf, buffer, solve)
    rows["p"] = start
    del start
    _levenberg_marquardt(problem, rows, out, max_iterations, tols)


def finish(out: Array, spec: Model, scale_errors: bool) -> Array:
    """The reported form of the parameters, and the errors scaled when asked."""
    xp = array_namespace(out)
    npar = len(spec.params)
    out[:, :npar] = spec.canonical(out[:, :npar])
    if scale_errors:
        dof = out[:, 2 * npar + 1]
        scale = xp.sqrt(out[:, 2 * npar] / xp.where(dof > 0, dof, xp.nan))
        out[:, npar : 2 * npar] *= scale[:, None]
    return out


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
    kept with the running candidates' arrays), the Jacobian's buffer and the twin's batched
    solve.

    Reusing one buffer matters on Dask workers, whose allocator returns large blocks to the
    system at once (``MALLOC_TRIM_THRESHOLD_``): a new Jacobian per block would page-fault.
    """

    spec: Model
    shape: tuple[int, int]
    block: int
    psf: Array | None
    jacobian: Array  # (block, p, ny, nx) buffer, reused for every block's Jacobian
    solve: Solve

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
        delta, singular = problem.solve(m, g)
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


def jacobi_scaled(m: Array, g: Array) -> tuple[Array, Array, Array, Array]:
    """The systems ``m delta = g`` (k, p, p) and (k, p) Jacobi-scaled to a unit diagonal:
    the scaled matrices, right-hand sides and scales ``s`` (``delta = s y`` where
    ``scaled y = rhs``), and the candidates already singular (a non-positive or non-finite
    diagonal, or a non-finite entry), whose systems become ``I y = 0``."""
    xp = array_namespace(m)
    npar = m.shape[-1]
    eye = xp.eye(npar, dtype=m.dtype)
    dg = _diag(m)
    bad = ~((dg > 0).all(axis=1) & xp.isfinite(m).all(axis=(1, 2)) & xp.isfinite(g).all(axis=1))
    s = 1.0 / xp.sqrt(xp.where(bad[:, None], 1.0, dg))
    scaled = xp.where(bad[:, None, None], eye, m * s[:, :, None] * s[:, None, :])
    rhs = xp.where(bad[:, None], 0.0, g * s)
    return scaled, rhs, s, bad


def flag_singular(scaled: Array, rhs: Array, bad: Array) -> tuple[Array, Array]:
    """What a twin does when the batched LU of ``scaled`` fails: the matrices whose
    eigenvalue ratio is not above ``SINGULAR_RCOND`` join ``bad``, and the systems are
    solved again with those replaced by ``I y = 0``. Returns ``y`` (k, p) and ``bad``."""
    xp = array_namespace(scaled)
    eye = xp.eye(scaled.shape[-1], dtype=scaled.dtype)
    w = xp.linalg.eigvalsh(scaled)
    bad = bad | ~(w[:, 0] > SINGULAR_RCOND * w[:, -1])
    scaled = xp.where(bad[:, None, None], eye, scaled)
    y = xp.linalg.solve(scaled, xp.where(bad[:, None], 0.0, rhs)[:, :, None])[:, :, 0]
    return y, bad


def unscale(s: Array, y: Array, bad: Array) -> tuple[Array, Array]:
    """The steps ``delta = s y`` (k, p), 0 for the singular candidates (``bad``, and those
    whose step is not finite), and that flag."""
    xp = array_namespace(y)
    delta = s * y
    bad = bad | ~xp.isfinite(delta).all(axis=1)
    return xp.where(bad[:, None], 0.0, delta), bad


def errors(a: Array, xp: Any) -> tuple[Array, Array]:
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
    err, singular = errors(state["a"][done], array_namespace(done))
    write(out, state["idx"][done], state["p"][done], err, singular, state["cost"][done],
          state["iters"][done], state["status"][done])


def write(out: Array, rows: Array, p: Array, err: Array, singular: Array, cost: Array,
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
