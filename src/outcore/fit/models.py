"""Dipole models on a stamp grid: two lobes of opposite sign on a constant background.

Conventions shared by every model (all lengths in pixels):

- pixel ``(i, j)`` of an ``(ny, nx)`` stamp is sampled at its centre, at
  ``y = i - (ny - 1) / 2`` and ``x = j - (nx - 1) / 2``: coordinates are relative to the stamp
  centre and ``x`` runs along the last axis;
- a lobe's flux is its integral over the plane, so a stamp's pixel sum approaches
  ``flux_pos + flux_neg + background * ny * nx`` when both lobes lie well inside it;
- a real dipole has ``flux_pos > 0`` and ``flux_neg < 0``; the fit does not force the signs.

Every function works on numpy or cupy arrays alike (the namespace of ``params``) and is
vectorised over the ``n`` candidates of a batch. ``evaluate`` returns ``(n, ny, nx)``;
``jacobian`` returns ``(n, ny, nx, p)``, a view of a parameter-major ``(n, p, ny, nx)``
buffer (new, or the ``out=`` one the fitter reuses) so that the fitter reads one
parameter's derivatives as one contiguous plane.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from outcore.backend import array_namespace

Array = Any
GAUSSIAN_PARAMS = ("x_pos", "y_pos", "x_neg", "y_neg", "flux_pos", "flux_neg", "sigma",
                   "background")
PSF_PARAMS = ("x_pos", "y_pos", "x_neg", "y_neg", "flux_pos", "flux_neg", "background")

#: Keys cubic-convolution parameter of the PSF interpolant.
CUBIC_A = -0.5


def pixel_grid(shape: tuple[int, int], xp: Any) -> tuple[Array, Array]:
    """Centred pixel coordinates ``(y (ny,), x (nx,))`` of an ``(ny, nx)`` stamp, float64."""
    ny, nx = shape
    return (xp.arange(ny, dtype=xp.float64) - (ny - 1) / 2,
            xp.arange(nx, dtype=xp.float64) - (nx - 1) / 2)


def _jacobian_buffer(out: Array | None, n: int, npar: int, shape: tuple[int, int],
                     xp: Any) -> Array:
    """``out`` (a reused ``(n, p, ny, nx)`` float64 buffer) or a new one."""
    if out is None:
        return xp.empty((n, npar, *shape), dtype=xp.float64)
    if out.shape != (n, npar, *shape):
        raise ValueError(f"out has shape {out.shape}; expected {(n, npar, *shape)}.")
    return out


# --- gaussian -------------------------------------------------------------------------------


def _gaussian_axes(params: Array, shape: tuple[int, int], xp: Any) -> dict[str, Array]:
    """Per-axis pieces of both lobes (axis 1: positive, negative lobe): offsets ``dx``
    (n, 2, nx) and ``dy`` (n, 2, ny), profiles ``ex`` along x and unit-flux profiles
    ``cy = e_y / (2 pi sigma^2)`` along y, and ``sigma``, ``s2`` (n, 1, 1)."""
    y, x = pixel_grid(shape, xp)
    sigma = params[:, 6, None, None]
    s2 = sigma * sigma
    dx = x - params[:, 0:4:2, None]
    dy = y - params[:, 1:4:2, None]
    ex = xp.exp(dx * dx / (-2 * s2))
    cy = xp.exp(dy * dy / (-2 * s2)) / (2 * math.pi * s2)
    return {"dx": dx, "dy": dy, "ex": ex, "cy": cy, "sigma": sigma, "s2": s2}


def gaussian_evaluate(params: Array, shape: tuple[int, int]) -> Array:
    """Two circular Gaussian lobes of shared width plus a background, ``(n, ny, nx)``.

    ``lobe(x, y) = flux / (2 pi sigma^2) * exp(-((x - x0)^2 + (y - y0)^2) / (2 sigma^2))``
    sampled at pixel centres; ``params`` is ``(n, 8)`` in the order of ``GAUSSIAN_PARAMS``.
    """
    xp = array_namespace(params)
    f = _gaussian_axes(params, shape, xp)
    out = xp.matmul((f["cy"] * params[:, 4:6, None]).transpose(0, 2, 1), f["ex"])
    out += params[:, 7, None, None]
    return out


def gaussian_jacobian(params: Array, shape: tuple[int, int], *, out: Array | None = None) -> Array:
    """Analytic derivatives of ``gaussian_evaluate``, ``(n, ny, nx, 8)``.

    With ``u`` a unit-flux lobe and ``L = flux * u``: ``dL/dx0 = L (x - x0) / sigma^2``,
    ``dL/dflux = u``, ``dL/dsigma = L (r^2 - 2 sigma^2) / sigma^3``, ``d/dbackground = 1``.
    Both lobes are separable, so each plane is a sum of outer products of per-axis factors
    ``ys (n, 10, ny)`` and ``xs (n, 10, nx)``: terms 0-5 are the planes of ``x_pos`` ..
    ``flux_neg``, one each, and terms 6-9 add up to the plane of ``sigma``, as
    ``dL/dsigma = flux c / sigma^3 [e_y (x) e_x (dx^2 - s^2) + e_y (dy^2 - s^2) (x) e_x]``.
    """
    xp = array_namespace(params)
    n = params.shape[0]
    f = _gaussian_axes(params, shape, xp)
    dx, dy, ex, sigma, s2 = f["dx"], f["dy"], f["ex"], f["sigma"], f["s2"]
    slope_y = f["cy"] * (params[:, 4:6, None] / s2)
    ys = xp.empty((n, 10, shape[0]), dtype=xp.float64)
    xs = xp.empty((n, 10, shape[1]), dtype=xp.float64)
    ys[:, 0:4:2], xs[:, 0:4:2] = slope_y, ex * dx  # x_pos, x_neg
    ys[:, 1:4:2], xs[:, 1:4:2] = slope_y * dy, ex  # y_pos, y_neg
    ys[:, 4:6], xs[:, 4:6] = f["cy"], ex  # flux_pos, flux_neg
    ys[:, 6:10:2], xs[:, 6:10:2] = slope_y / sigma, ex * (dx * dx - s2)
    ys[:, 7:10:2], xs[:, 7:10:2] = slope_y * (dy * dy - s2) / sigma, ex
    jac = _jacobian_buffer(out, n, 8, shape, xp)
    xp.multiply(ys[:, :6, :, None], xs[:, :6, None, :], out=jac[:, :6])
    jac[:, 6] = xp.matmul(ys[:, 6:].transpose(0, 2, 1), xs[:, 6:])
    jac[:, 7] = 1.0
    return jac.transpose(0, 2, 3, 1)


# --- psf ------------------------------------------------------------------------------------


def cubic_kernel(t: Array) -> tuple[Array, Array]:
    """Keys cubic-convolution weights ``w(t)`` and their derivative ``dw/dt`` (a = -0.5).

    ``w`` is one cubic on ``|t| <= 1``, another on ``1 < |t| < 2`` and 0 beyond; both vanish
    at the joins, and their slopes agree there (``a`` at 1, 0 at 2), so evaluating each on
    ``|t|`` clipped to its own interval and adding gives ``w`` and ``dw`` without branches.
    The weights sum to one over any unit-spaced set of taps, so interpolation keeps flux.
    """
    xp = array_namespace(t)
    a = xp.abs(t)
    inner, outer = xp.minimum(a, 1.0), xp.clip(a, 1.0, 2.0)
    del a
    w = ((CUBIC_A + 2) * inner - (CUBIC_A + 3)) * inner * inner + 1
    w += ((CUBIC_A * outer - 5 * CUBIC_A) * outer + 8 * CUBIC_A) * outer - 4 * CUBIC_A
    dw = (3 * (CUBIC_A + 2) * inner - 2 * (CUBIC_A + 3)) * inner
    dw += (3 * CUBIC_A * outer - 10 * CUBIC_A) * outer + 7 * CUBIC_A
    dw *= xp.sign(t)
    return w, dw


def normalise_psf(psf: Array) -> Array:
    """A PSF ``(py, px)`` or ``(n, py, px)`` scaled to unit sum per stamp, float64."""
    xp = array_namespace(psf)
    psf = xp.asarray(psf, dtype=xp.float64)
    return psf / psf.sum(axis=(-2, -1), keepdims=True)


def _psf_weights(x0: Array, grid: Array, taps: int, xp: Any) -> tuple[Array, Array]:
    """Interpolation matrices ``K[n, i, k] = w(grid_i - x0_n - u_k)`` and ``dK/dx0`` (n, len, taps).

    ``u_k`` are the PSF's own centred sample positions. ``w`` is even, so ``K`` is also
    ``w(x0_n + u_k - grid_i)``, whose derivative in ``x0`` is the kernel's own ``dw``.
    """
    u = xp.arange(taps, dtype=xp.float64) - (taps - 1) / 2
    return cubic_kernel(x0[:, None, None] + u[None, None, :] - grid[None, :, None])


def _psf_lobe(ky: Array, kx: Array, psf: Array) -> Array:
    """``ky @ psf @ kx^T``: a PSF resampled on the stamp, ``(n, ny, nx)``."""
    return ky @ (psf @ kx.transpose(0, 2, 1))


def psf_evaluate(params: Array, shape: tuple[int, int], psf: Array) -> Array:
    """Two PSF lobes plus a background, ``(n, ny, nx)``.

    ``lobe(x, y) = flux * sum_kl w(y - y0 - v_k) P_kl w(x - x0 - u_l)``: the unit-sum PSF
    ``P`` (``(py, px)`` for all candidates or ``(n, py, px)``, centred at ``((py - 1) / 2,
    (px - 1) / 2)`` of its own grid) shifted by Keys cubic interpolation ``w``. ``params``
    is ``(n, 7)`` in the order of ``PSF_PARAMS``.
    """
    xp = array_namespace(params)
    psf = normalise_psf(psf)
    y, x = pixel_grid(shape, xp)
    py, px = psf.shape[-2:]
    out = xp.broadcast_to(params[:, 6, None, None], (params.shape[0], *shape)).copy()
    for ix, iy, iflux in ((0, 1, 4), (2, 3, 5)):
        ky, _ = _psf_weights(params[:, iy], y, py, xp)
        kx, _ = _psf_weights(params[:, ix], x, px, xp)
        out += params[:, iflux, None, None] * _psf_lobe(ky, kx, psf)
    return out


def psf_jacobian(params: Array, shape: tuple[int, int], psf: Array, *,
                 out: Array | None = None) -> Array:
    """Analytic derivatives of ``psf_evaluate``, ``(n, ny, nx, 7)``, through ``dw/dt``."""
    xp = array_namespace(params)
    psf = normalise_psf(psf)
    y, x = pixel_grid(shape, xp)
    py, px = psf.shape[-2:]
    jac = _jacobian_buffer(out, params.shape[0], 7, shape, xp)
    for ix, iy, iflux in ((0, 1, 4), (2, 3, 5)):
        flux = params[:, iflux, None, None]
        ky, dky = _psf_weights(params[:, iy], y, py, xp)
        kx, dkx = _psf_weights(params[:, ix], x, px, xp)
        jac[:, iflux] = _psf_lobe(ky, kx, psf)
        xp.multiply(flux, _psf_lobe(ky, dkx, psf), out=jac[:, ix])
        xp.multiply(flux, _psf_lobe(dky, kx, psf), out=jac[:, iy])
        del ky, dky, kx, dkx  # before the next lobe's weights are made
    jac[:, 6] = 1.0
    return jac.transpose(0, 2, 3, 1)


# --- start ----------------------------------------------------------------------------------


def _masked_median(values: Array, ok: Array) -> Array:
    """Median of each row of ``values`` (n, k) over the entries where ``ok``; NaN for none."""
    xp = array_namespace(values)
    count = ok.sum(axis=1)
    ranked = xp.sort(xp.where(ok, values, xp.inf), axis=1)
    lo = xp.maximum((count - 1) // 2, 0)[:, None]
    hi = xp.minimum(count // 2, values.shape[1] - 1)[:, None]
    mid = 0.5 * (xp.take_along_axis(ranked, lo, 1) + xp.take_along_axis(ranked, hi, 1))[:, 0]
    return xp.where(count > 0, mid, xp.nan)


def moment_start(images: Array, valid: Array) -> Array:
    """Starting parameters from moments, ``(n, 8)`` in the order of ``GAUSSIAN_PARAMS``.

    The background is the median of the stamp's unmasked border pixels (of all unmasked
    pixels when the border is masked) and the noise ``t`` 1.4826 times their median absolute
    deviation. The positive part ``max(d - t, 0)`` and negative part ``max(-d - t, 0)`` of the
    background-subtracted stamp ``d`` give each lobe's centroid, its flux (the sum of ``d``
    over those pixels) and, from their second moments, a shared width. Fluxes are kept at
    least ``t`` from zero so that every position has a non-zero derivative. ``images`` and
    ``valid`` (True where a pixel counts) are ``(n, ny, nx)``.
    """
    xp = array_namespace(images)
    n, ny, nx = images.shape
    y, x = pixel_grid((ny, nx), xp)
    border = xp.ones((ny, nx), dtype=bool)
    border[1:-1, 1:-1] = False
    flat, ok = images.reshape(n, ny * nx), valid.reshape(n, ny * nx)
    edge, edge_ok = flat[:, border.reshape(-1)], ok[:, border.reshape(-1)]
    bg = _masked_median(edge, edge_ok)
    bg = xp.where(xp.isnan(bg), _masked_median(flat, ok), bg)
    noise = 1.4826 * _masked_median(xp.abs(edge - bg[:, None]), edge_ok)
    noise = xp.where(xp.isnan(noise), 0.0, noise)
    d = xp.where(valid, images - bg[:, None, None], 0.0)
    start = xp.empty((n, 8), dtype=xp.float64)
    width2 = xp.zeros(n, dtype=xp.float64)
    weight_sum = xp.zeros(n, dtype=xp.float64)
    for sign, (ix, iy, iflux) in ((1.0, (0, 1, 4)), (-1.0, (2, 3, 5))):
        part = xp.maximum(sign * d - noise[:, None, None], 0.0)
        total = part.sum(axis=(1, 2))
        safe = xp.where(total > 0, total, 1.0)
        along_x, along_y = part.sum(axis=1), part.sum(axis=2)
        cx = (along_x * x).sum(axis=1) / safe
        cy = (along_y * y).sum(axis=1) / safe
        width2 += (along_x * (x - cx[:, None]) ** 2).sum(axis=1)
        width2 += (along_y * (y - cy[:, None]) ** 2).sum(axis=1)
        weight_sum += total
        flux = xp.where(part > 0, sign * d, 0.0).sum(axis=(1, 2))
        start[:, ix], start[:, iy] = cx, cy
        start[:, iflux] = sign * xp.maximum(flux, noise + 1e-3 * xp.abs(d).max(axis=(1, 2)))
    sigma = xp.sqrt(width2 / (2 * xp.where(weight_sum > 0, weight_sum, 1.0)))
    start[:, 6] = xp.clip(sigma, 0.5, min(ny, nx) / 4)
    start[:, 7] = bg
    return start


def _gaussian_canonical(params: Array) -> Array:
    """The model depends on ``sigma^2`` only: report the positive width."""
    xp = array_namespace(params)
    params[:, 6] = xp.abs(params[:, 6])
    return params


def _psf_start(images: Array, valid: Array) -> Array:
    start = moment_start(images, valid)
    return start[:, [0, 1, 2, 3, 4, 5, 7]]


# --- registry -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Model:
    """A dipole model: parameter names, evaluate, jacobian, start, and whether it needs a PSF.

    With ``needs_psf``, ``evaluate`` and ``jacobian`` take the PSF as a third argument.
    ``canonical`` maps fitted parameters (in place) to the form reported, e.g. ``|sigma|``.
    """

    name: str
    params: tuple[str, ...]
    evaluate: Callable[..., Array]
    jacobian: Callable[..., Array]
    start: Callable[[Array, Array], Array]
    needs_psf: bool
    canonical: Callable[[Array], Array] = lambda params: params


MODELS: dict[str, Model] = {
    "gaussian": Model("gaussian", GAUSSIAN_PARAMS, gaussian_evaluate, gaussian_jacobian,
                      moment_start, needs_psf=False, canonical=_gaussian_canonical),
    "psf": Model("psf", PSF_PARAMS, psf_evaluate, psf_jacobian, _psf_start, needs_psf=True),
}


def get_model(name: str) -> Model:
    """The model called ``name`` (``"gaussian"`` or ``"psf"``); ValueError otherwise."""
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"Unknown model {name!r}; choose one of {sorted(MODELS)}.") from None
