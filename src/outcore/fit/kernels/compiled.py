"""The host's compiled loop (numba) for the Gaussian dipole model, which ``cpu.fit_chunk``
runs for ``cpu.COMPILED_MODELS``: one compiled loop per candidate instead of array operations
over the chunk.

It runs the algorithm of the array code (``arrays``) step for step, on the same inputs (the
float64 data, zero where ignored, its ``sqrt(1 / variance)`` weights and the valid pixels
that ``arrays.setup`` makes): the moment start of ``models.moment_start``, then
Levenberg-Marquardt with Marquardt's scaling, the same trial and acceptance rules, the same
``LAMBDA_*`` constants and stopping tests in the same order, and the same Jacobi-scaled solve
(LU with partial pivoting; a zero pivot or a non-finite step is ``singular``). The model, its
Jacobian and the normal equations are fused: the separable per-axis factors of both lobes
(``models.gaussian_jacobian``) are multiplied out pixel by pixel into the weighted Jacobian of
one candidate (eight planes of ``ny * nx``, in cache), and ``J^T W J`` and ``J^T W r`` are
its dot products. Only the summation order differs from the array code, so the fits agree
to rounding at the start and to the tolerances at the end.

``fit_gaussian`` writes, per candidate, the parameters, the final normal matrix (from which
the caller takes the errors, as the array code does), chi2, iterations and status.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from outcore.fit.kernels.lm import (
    LAMBDA_DOWN,
    LAMBDA_RANGE,
    LAMBDA_START,
    LAMBDA_UP,
    SINGULAR_RCOND,
    STATUS,
)

#: Reordered sums, fused multiply-adds, reciprocals and library functions as LLVM likes them
#: (NaN and Inf keep their meaning: the stopping tests need them). The fits stay those of
#: the array code to 1e-14 px (positions) and 1e-10 relative (fluxes).
_JIT = {"nogil": True, "cache": True, "fastmath": {"reassoc", "contract", "nsz", "arcp", "afn"}}
_TWO_PI = 2.0 * math.pi
_F_TOL = STATUS["converged_f_tol"]
_X_TOL = STATUS["converged_x_tol"]
_G_TOL = STATUS["converged_g_tol"]
_MAX_ITER = STATUS["max_iterations"]
_SINGULAR = STATUS["singular"]


@numba.njit(inline="always", **_JIT)
def _median(values, count):
    """Median of ``values[:count]``, which it sorts in place; NaN when ``count`` is 0."""
    if count == 0:
        return np.nan
    for i in range(1, count):  # insertion sort: a few dozen values
        v = values[i]
        k = i - 1
        while k >= 0 and values[k] > v:
            values[k + 1] = values[k]
            k -= 1
        values[k + 1] = v
    return 0.5 * (values[(count - 1) // 2] + values[count // 2])


@numba.njit(inline="always", **_JIT)
def _distance_median(ranked, count, centre):
    """Median of ``|ranked[:count] - centre|`` for sorted ``ranked``: the distances below and
    above ``centre`` are two sorted runs, merged up to the middle ranks."""
    if count == 0:
        return np.nan
    below = 0  # ranked[:below] <= centre
    while below < count and ranked[below] <= centre:
        below += 1
    lo, hi = below - 1, below  # next candidates: walking down from below, up from above
    first = second = 0.0
    for rank in range(count // 2 + 1):
        if hi >= count or (lo >= 0 and abs(ranked[lo] - centre) <= abs(ranked[hi] - centre)):
            value = abs(ranked[lo] - centre)
            lo -= 1
        else:
            value = abs(ranked[hi] - centre)
            hi += 1
        if rank == (count - 1) // 2:
            first = value
        if rank == count // 2:
            second = value
    return 0.5 * (first + second)


@numba.njit(inline="always", **_JIT)
def _start(data, valid, ny, nx, p, work, d):
    """``models.moment_start`` of one candidate into ``p``; ``work`` holds ``ny * nx``
    values, ``d`` the background-subtracted stamp."""
    m = ny * nx
    count = 0
    for i in range(ny):
        for j in range(nx):
            k = i * nx + j
            if (i == 0 or i == ny - 1 or j == 0 or j == nx - 1) and valid[k]:
                work[count] = data[k]
                count += 1
    edge = count
    bg = _median(work, count)
    if math.isnan(bg):
        count = 0
        for k in range(m):
            if valid[k]:
                work[count] = data[k]
                count += 1
        bg = _median(work, count)
    noise = 1.4826 * _distance_median(work, edge, bg) if edge > 0 else 0.0
    top = 0.0
    for k in range(m):
        d[k] = data[k] - bg if valid[k] else 0.0
        top = max(top, abs(d[k]))
    cx0, cy0 = (nx - 1) / 2.0, (ny - 1) / 2.0
    width2 = 0.0
    weight_sum = 0.0
    for lobe in range(2):  # branch-free sums (the parts are zero off the lobe)
        sign = 1.0 if lobe == 0 else -1.0
        total = sx = sy = flux = 0.0
        for i in range(ny):
            for j in range(nx):
                value = sign * d[i * nx + j]
                part = max(value - noise, 0.0)
                total += part
                sx += part * (j - cx0)
                sy += part * (i - cy0)
                flux += value if part > 0.0 else 0.0
        safe = total if total > 0.0 else 1.0
        cx, cy = sx / safe, sy / safe
        for i in range(ny):
            for j in range(nx):
                part = max(sign * d[i * nx + j] - noise, 0.0)
                width2 += part * ((j - cx0 - cx) ** 2 + (i - cy0 - cy) ** 2)
        weight_sum += total
        p[2 * lobe], p[2 * lobe + 1] = cx, cy
        p[4 + lobe] = sign * max(flux, noise + 1e-3 * top)
    sigma = math.sqrt(width2 / (2.0 * (weight_sum if weight_sum > 0.0 else 1.0)))
    p[6] = min(max(sigma, 0.5), min(ny, nx) / 4.0)
    p[7] = bg


@numba.njit(inline="always", **_JIT)
def _axes(p, ny, nx, ex, cy, dx, dy):
    """Per-axis factors of both lobes: offsets ``dx (2, nx)``, ``dy (2, ny)``, profiles
    ``ex`` along x and unit-flux profiles ``cy = e_y / (2 pi sigma^2)`` along y."""
    s2 = p[6] * p[6]
    norm = 1.0 / (_TWO_PI * s2)
    for lobe in range(2):
        for j in range(nx):
            t = (j - (nx - 1) / 2.0) - p[2 * lobe]
            dx[lobe, j] = t
            ex[lobe, j] = math.exp(t * t / (-2.0 * s2))
        for i in range(ny):
            t = (i - (ny - 1) / 2.0) - p[2 * lobe + 1]
            dy[lobe, i] = t
            cy[lobe, i] = math.exp(t * t / (-2.0 * s2)) * norm


@numba.njit(inline="always", **_JIT)
def _residual(p, data, sqrtw, ny, nx, r, ex, cy, dx, dy):
    """Weighted residual ``sqrt(w) (data - model)`` into ``r``; returns chi2."""
    _axes(p, ny, nx, ex, cy, dx, dy)
    chi2 = 0.0
    for i in range(ny):
        ap = p[4] * cy[0, i]
        an = p[5] * cy[1, i]
        for j in range(nx):
            k = i * nx + j
            value = sqrtw[k] * (data[k] - (ap * ex[0, j] + an * ex[1, j] + p[7]))
            r[k] = value
            chi2 += value * value
    return chi2


@numba.njit(inline="always", **_JIT)
def _normal(p, sqrtw, r, ny, nx, jt, a, g, ex, cy, dx, dy, ys, xs):
    """``A = J^T W J`` into ``a`` and ``J^T W r`` into ``g`` at ``p``, through the weighted
    Jacobian ``jt (8, ny * nx)`` (``models.gaussian_jacobian``'s factors). ``ex``, ``cy``,
    ``dx``, ``dy`` must hold the axes of ``p``: the residual ``r`` at ``p`` just made them."""
    sigma = p[6]
    s2 = sigma * sigma
    for lobe in range(2):
        for i in range(ny):
            slope = cy[lobe, i] * (p[4 + lobe] / s2)
            ys[2 * lobe, i] = slope  # x0
            ys[2 * lobe + 1, i] = slope * dy[lobe, i]  # y0
            ys[4 + lobe, i] = cy[lobe, i]  # flux
            ys[6 + 2 * lobe, i] = slope / sigma  # sigma, x term
            ys[7 + 2 * lobe, i] = slope * (dy[lobe, i] ** 2 - s2) / sigma  # sigma, y term
        for j in range(nx):
            xs[2 * lobe, j] = ex[lobe, j] * dx[lobe, j]
            xs[2 * lobe + 1, j] = ex[lobe, j]
            xs[4 + lobe, j] = ex[lobe, j]
            xs[6 + 2 * lobe, j] = ex[lobe, j] * (dx[lobe, j] ** 2 - s2)
            xs[7 + 2 * lobe, j] = ex[lobe, j]
    for q in range(6):
        for i in range(ny):
            y = ys[q, i]
            for j in range(nx):
                jt[q, i * nx + j] = y * xs[q, j] * sqrtw[i * nx + j]
    for i in range(ny):
        y6, y7, y8, y9 = ys[6, i], ys[7, i], ys[8, i], ys[9, i]
        for j in range(nx):
            k = i * nx + j
            jt[6, k] = (y6 * xs[6, j] + y7 * xs[7, j] + y8 * xs[8, j] + y9 * xs[9, j]) * sqrtw[k]
            jt[7, k] = sqrtw[k]
    m = ny * nx
    for q in range(0, jt.shape[0], 2):  # two rows at a time share each load of the other
        for t in range(q + 3):
            s0 = s1 = 0.0
            for k in range(m):
                v = jt[t, k] if t <= q + 1 else r[k]
                s0 += jt[q, k] * v
                s1 += jt[q + 1, k] * v
            if t == q + 2:
                g[q], g[q + 1] = s0, s1
                continue
            if t <= q:
                a[q, t] = a[t, q] = s0
            a[q + 1, t] = a[t, q + 1] = s1


@numba.njit(inline="always", **_JIT)
def _solve(a, g, lam, d, delta, lu, rhs, scale):
    """``cpu.solve`` for one candidate: ``(a + lam diag(d)) delta = g``, Jacobi-scaled,
    by LU with partial pivoting. Returns True (and ``delta = 0``) when singular."""
    n = a.shape[0]
    bad = False
    for q in range(n):
        for t in range(n):
            lu[q, t] = a[q, t]
            bad |= not math.isfinite(a[q, t])
        lu[q, q] += lam * d[q]
        bad |= not (lu[q, q] > 0.0 and math.isfinite(lu[q, q]) and math.isfinite(g[q]))
    if not bad:
        for q in range(n):
            scale[q] = 1.0 / math.sqrt(lu[q, q])
        for q in range(n):
            for t in range(n):
                lu[q, t] *= scale[q] * scale[t]
            rhs[q] = g[q] * scale[q]
        for col in range(n):  # elimination with partial pivoting, as LAPACK's getrf
            pivot = col
            for q in range(col + 1, n):
                if abs(lu[q, col]) > abs(lu[pivot, col]):
                    pivot = q
            if lu[pivot, col] == 0.0:
                bad = True
                break
            if pivot != col:
                for t in range(n):
                    lu[col, t], lu[pivot, t] = lu[pivot, t], lu[col, t]
                rhs[col], rhs[pivot] = rhs[pivot], rhs[col]
            for q in range(col + 1, n):
                f = lu[q, col] / lu[col, col]
                for t in range(col + 1, n):
                    lu[q, t] -= f * lu[col, t]
                rhs[q] -= f * rhs[col]
    if not bad:
        for q in range(n - 1, -1, -1):
            total = rhs[q]
            for t in range(q + 1, n):
                total -= lu[q, t] * delta[t]
            delta[q] = total / lu[q, q]
        for q in range(n):
            delta[q] *= scale[q]
            bad |= not math.isfinite(delta[q])
    if bad:
        delta[:] = 0.0
    return bad


@numba.njit(inline="always", **_JIT)
def _gradient_cosine(a, g, cost):
    """``arrays._gradient_cosine`` for one candidate."""
    worst = 0.0
    for q in range(a.shape[0]):
        denom = math.sqrt(a[q, q] * cost)
        if denom > 0.0:
            worst = max(worst, abs(g[q]) / denom)
        elif abs(g[q]) > 0.0:
            worst = np.inf
    return worst


@numba.njit(**_JIT)
def errors(a, err, undecided):
    """``arrays.errors`` where a Cholesky factor settles it: for each normal matrix
    ``a (n, 8, 8)``, the square roots of the diagonal of ``a^-1`` into ``err``, or NaN when
    ``a``'s diagonal is not positive and finite (singular). The Jacobi-scaled matrix has unit
    diagonal, so its largest eigenvalue is at most 8 and its smallest at least
    ``1 / trace(inverse)``; where that bound cannot show the eigenvalue ratio above
    ``SINGULAR_RCOND`` (or the factor fails), ``undecided`` is set and the caller decides
    with the eigenvalues."""
    n, npar = a.shape[0], a.shape[1]
    lo = np.empty((npar, npar))
    inv = np.empty(npar)
    scale = np.empty(npar)
    column = np.empty(npar)
    for c in range(n):
        undecided[c] = False
        good = True
        for q in range(npar):
            good &= a[c, q, q] > 0.0 and math.isfinite(a[c, q, q])
            for t in range(npar):
                good &= math.isfinite(a[c, q, t])
        if not good:
            err[c, :] = np.nan
            continue
        for q in range(npar):
            scale[q] = 1.0 / math.sqrt(a[c, q, q])
        for q in range(npar):  # Cholesky of the scaled matrix, lower triangle
            for t in range(q + 1):
                total = a[c, q, t] * scale[q] * scale[t]
                for s in range(t):
                    total -= lo[q, s] * lo[t, s]
                if t == q:
                    good &= total > 0.0
                    lo[q, q] = math.sqrt(total) if total > 0.0 else 1.0
                else:
                    lo[q, t] = total / lo[t, t]
        trace = 0.0
        if good:
            inv[:] = 0.0
            for t in range(npar):  # column t of L^-1; (L L^T)^-1_qq = sum_t L^-1[t, q]^2
                for q in range(npar):
                    total = 1.0 if q == t else 0.0
                    for s in range(t, q):
                        total -= lo[q, s] * column[s]
                    column[q] = total / lo[q, q] if q >= t else 0.0
                for q in range(t, npar):
                    inv[t] += column[q] * column[q]
            for q in range(npar):
                trace += inv[q]
        if not good or not (1.0 / trace > 1.01 * SINGULAR_RCOND * npar):
            undecided[c] = True
            continue
        for q in range(npar):
            err[c, q] = scale[q] * math.sqrt(inv[q])


@numba.njit(**_JIT)
def fit_gaussian(data, sqrtw, valid, ny, nx, max_iterations, f_tol, x_tol, g_tol,
                 p_out, a_out, cost_out, iters_out, status_out):
    """Fit every candidate (rows of ``data``, ``sqrtw``, ``valid``, each ``(n, ny * nx)``);
    write its parameters ``p_out (n, 8)``, normal matrix ``a_out (n, 8, 8)``, chi2,
    iterations and status (the code at the end of the iterations: the caller flags the
    candidates whose normal matrix is singular, as ``arrays._retire`` does)."""
    n, m = data.shape
    npar = p_out.shape[1]
    r, trial_r = np.empty(m), np.empty(m)
    jt = np.empty((npar, m))
    work, dstamp = np.empty(m), np.empty(m)
    ex, dx = np.empty((2, nx)), np.empty((2, nx))
    cy, dy = np.empty((2, ny)), np.empty((2, ny))
    ys, xs = np.empty((10, ny)), np.empty((10, nx))
    g, d, delta, trial = np.empty(npar), np.empty(npar), np.empty(npar), np.empty(npar)
    lu, rhs, scale = np.empty((npar, npar)), np.empty(npar), np.empty(npar)
    for c in range(n):
        p, a = p_out[c], a_out[c]
        _start(data[c], valid[c], ny, nx, p, work, dstamp)
        cost = _residual(p, data[c], sqrtw[c], ny, nx, r, ex, cy, dx, dy)
        _normal(p, sqrtw[c], r, ny, nx, jt, a, g, ex, cy, dx, dy, ys, xs)
        for q in range(npar):
            d[q] = a[q, q]
        lam = LAMBDA_START
        iters = 0
        status = -1
        while True:
            if status < 0 and _gradient_cosine(a, g, cost) <= g_tol:
                status = _G_TOL
            if status < 0 and iters >= max_iterations:
                status = _MAX_ITER
            if status >= 0:
                break
            singular = _solve(a, g, lam, d, delta, lu, rhs, scale)
            for q in range(npar):
                trial[q] = p[q] + delta[q]
            trial_cost = _residual(trial, data[c], sqrtw[c], ny, nx, trial_r, ex, cy, dx, dy)
            predicted = 0.0
            step = 0.0
            size = 0.0
            for q in range(npar):
                predicted += delta[q] * (g[q] + lam * d[q] * delta[q])
                step += d[q] * delta[q] * delta[q]
                size += d[q] * p[q] * p[q]
            actual = cost - trial_cost
            accept = trial_cost < cost and not singular
            f_conv = abs(actual) <= f_tol * cost and predicted <= f_tol * cost
            x_conv = math.sqrt(step) <= x_tol * (math.sqrt(size) + x_tol)
            iters += 1
            status = _SINGULAR if singular else _F_TOL if f_conv else _X_TOL if x_conv else -1
            if accept:
                p[:] = trial
                cost = trial_cost
                lam = max(lam / LAMBDA_DOWN, LAMBDA_RANGE[0])
                _normal(p, sqrtw[c], trial_r, ny, nx, jt, a, g, ex, cy, dx, dy, ys, xs)
                for q in range(npar):
                    d[q] = max(d[q], a[q, q])
            else:
                lam = min(lam * LAMBDA_UP, LAMBDA_RANGE[1])
        cost_out[c] = cost
        iters_out[c] = iters
        status_out[c] = status
