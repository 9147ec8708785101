"""ZOGY on one window, written once against the window's array namespace (numpy or cupy):
the kernels' spectra and their FFT application (the equations are in ``outcore.diffim.zogy``).

``apply`` convolves a window with a pair's real-space kernels (``zogy.pair_kernels``) by FFT,
through ``backend.fft`` (``scipy.fft`` on the host, ``cupyx.scipy.fft`` on a GPU: the same
functions and arguments), and returns the outputs ``H`` pixels in from the window's edges,
which depend on the window's pixels only, so tiles with a halo of ``H`` give every output
pixel exactly as the whole image would.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from outcore.backend import array_namespace
from outcore.backend import fft as backend_fft
from outcore.diffim.zogy import ZogyKernels

Array = Any


def kernel_hat(kernel: np.ndarray, shape: tuple[int, int], xp: ModuleType) -> Array:
    """The real FFT, at ``shape``, of ``kernel`` placed with its middle pixel at index 0.

    The kernel fills only ``2 H + 1`` rows of the grid, so the row transforms run on those
    rows alone and the column transforms on the whole grid: the same numbers as ``rfft2`` of
    the padded grid (the same passes), in about 60 % of its time."""
    fft = backend_fft(xp)
    size, half = kernel.shape[0], kernel.shape[0] // 2
    ly, lx = shape
    rows = xp.zeros((size, lx))
    rows[:, : half + 1] = xp.asarray(kernel[:, half:])
    rows[:, lx - half:] = xp.asarray(kernel[:, :half])
    rows = fft.rfft(rows, axis=-1)
    grid = xp.zeros((ly, lx // 2 + 1), dtype=rows.dtype)
    grid[: half + 1] = rows[half:]
    grid[ly - half:] = rows[:half]
    return fft.fft(grid, axis=0, overwrite_x=True)


def apply(reference: Array, target: Array, var_r: Array, var_n: Array,
          kernels: ZogyKernels) -> dict[str, Array]:
    """``D``, ``V_D``, ``S`` and ``S_corr`` of a window (float64, numpy or cupy).

    The inputs are background-subtracted ``(ly, lx)`` windows, zero (value and variance)
    where a pixel is bad or outside the image. The outputs are ``(ly - 2 H, lx - 2 H)``: the
    window less ``H`` pixels at each edge, computed by FFTs of a fast length at least the
    window's, so no output pixel sees a wrapped one. ``S_corr`` is 0 where ``V_S`` is 0.
    """
    xp = array_namespace(reference)
    fft = backend_fft(xp)
    half = kernels.half_width
    ly, lx = reference.shape
    shape = (fft.next_fast_len(ly, real=True), fft.next_fast_len(lx, real=True))
    crop = np.s_[half: ly - half, half: lx - half]

    def inverse(spectrum: Array) -> Array:
        return xp.ascontiguousarray(fft.irfft2(spectrum, s=shape)[crop])

    def combine(k_n: np.ndarray, n_hat: Array, k_r: np.ndarray, r_hat: Array,
                sign: float) -> Array:
        """``k_n^ n^ + sign k_r^ r^``, holding two spectra besides the inputs."""
        out = kernel_hat(k_n, shape, xp)
        out *= n_hat
        other = kernel_hat(k_r, shape, xp)
        other *= r_hat
        if sign < 0:
            out -= other
        else:
            out += other
        return out

    # pixel i of a result is sum_m k[m] x[i - m] over |m| <= H (the kernel's centre at index
    # 0); for H <= i < l - H no term wraps around, and crop keeps those pixels.
    n_hat = fft.rfft2(target, s=shape)
    r_hat = fft.rfft2(reference, s=shape)
    out = {"difference": inverse(combine(kernels.dn, n_hat, kernels.dr, r_hat, -1)),
           "score": inverse(combine(kernels.sn, n_hat, kernels.sr, r_hat, -1))}
    del n_hat, r_hat
    vn_hat = fft.rfft2(var_n, s=shape)
    vr_hat = fft.rfft2(var_r, s=shape)
    var_dn, var_dr, var_sn, var_sr = kernels.variance_kernels()
    out["variance"] = inverse(combine(var_dn, vn_hat, var_dr, vr_hat, 1))
    var_s = inverse(combine(var_sn, vn_hat, var_sr, vr_hat, 1))
    del vn_hat, vr_hat
    floor = 1e-12 * float(xp.max(xp.abs(var_s))) if var_s.size else 0.0
    ok = var_s > floor
    out["score_corr"] = xp.where(ok, out["score"] / xp.sqrt(xp.where(ok, var_s, 1.0)), 0.0)
    out["variance"] = xp.maximum(out["variance"], 0.0)
    return out


# --- the kernel-fitting subtraction (``outcore.diffim.kernelfit``) ---------------------------

#: Rows of the design matrix built at once by ``normal_equations`` and ``stamp_chi2`` (its
#: memory: this many rows of patches and of unknowns).
FIT_BATCH = 2048


def fit_design(image: Array, ys: Array, xs: Array, functions: Array, half: int) -> Array:
    """``(n, k)``: each basis kernel of ``functions`` ``(k, (2 half + 1)^2)`` convolved
    with ``image``, at its pixels ``(ys, xs)`` (at least ``half`` from its edges):
    ``sum f[dy, dx] image[y - dy, x - dx]``, from each pixel's window of ``image`` (a
    correlation with the flipped kernels)."""
    xp = array_namespace(image)
    side = 2 * half + 1
    windows = xp.lib.stride_tricks.sliding_window_view(image, (side, side))
    patches = windows[ys - half, xs - half].reshape(ys.shape[0], side * side)
    flipped = functions.reshape(-1, side, side)[:, ::-1, ::-1].reshape(-1, side * side)
    return patches @ flipped.T


def design_rows(convolved: Array, terms: Array, background: Array) -> Array:
    """The rows of the design matrix: the unit kernel's column, each zero-sum kernel's
    column times each position term (kernel-major), then the background's terms."""
    xp = array_namespace(convolved)
    n = convolved.shape[0]
    spatial = (convolved[:, 1:, None] * terms[:, None, :]).reshape(n, -1)
    return xp.concatenate([convolved[:, :1], spatial, background], axis=1)


def normal_equations(image: Array, target: Array, weight: Array, ys: Array, xs: Array,
                     terms: Array, background: Array, functions: Array, half: int
                     ) -> tuple[Array, Array, float]:
    """``(A^T W A, A^T W y, y^T W y)`` of the fit of ``target`` at pixels ``(ys, xs)`` by
    ``image`` convolved with the basis (``design_rows``), weights ``weight`` per pixel,
    ``FIT_BATCH`` rows at a time (float64)."""
    xp = array_namespace(image)
    unknowns = 1 + (functions.shape[0] - 1) * terms.shape[1] + background.shape[1]
    normal = xp.zeros((unknowns, unknowns))
    right = xp.zeros(unknowns)
    total = 0.0
    for start in range(0, int(ys.shape[0]), FIT_BATCH):
        rows = slice(start, start + FIT_BATCH)
        a = design_rows(fit_design(image, ys[rows], xs[rows], functions, half), terms[rows],
                        background[rows])
        values = target[ys[rows], xs[rows]]
        weighted = a * weight[rows, None]
        normal += a.T @ weighted
        right += weighted.T @ values
        total += float((weight[rows] * values * values).sum())
    return normal, right, total


def stamp_sums(image: Array, target: Array, weight: Array, ys: Array, xs: Array,
               labels: Array, count: int, terms: Array, background: Array, functions: Array,
               half: int, coefficients: Array) -> Array:
    """``(5, count)``: for each stamp (``labels`` 0 to ``count - 1`` of the pixels) under the
    fit ``coefficients``, its weighted squared residuals (chi2), its pixels, the sum of its
    residuals, of its model and of its pixels' variances (``1 / weight``)."""
    xp = array_namespace(image)
    out = xp.zeros((5, count))
    for start in range(0, int(ys.shape[0]), FIT_BATCH):
        rows = slice(start, start + FIT_BATCH)
        a = design_rows(fit_design(image, ys[rows], xs[rows], functions, half), terms[rows],
                        background[rows])
        model = a @ coefficients
        residual = target[ys[rows], xs[rows]] - model
        for k, values in enumerate((weight[rows] * residual**2, xp.ones_like(model), residual,
                                    model, 1.0 / weight[rows])):
            out[k] += xp.bincount(labels[rows], weights=values, minlength=count)
    return out


def _powers(index: Array, size: int, origin: int, degree: int, xp: ModuleType) -> list:
    """``[t^0, ..., t^degree]`` of the scaled positions (``basis.scaled``) of ``index``
    pixels from ``origin`` on an image axis of ``size``."""
    half = (size - 1) / 2
    t = (xp.arange(index, dtype=xp.float64) + (origin - half)) / max(half, 1.0)
    out = [xp.ones_like(t)]
    for _ in range(degree):
        out.append(out[-1] * t)
    return out


def apply_fitted(reference: Array, target: Array, var_r: Array, var_n: Array, kernels: Any,
                 origin: tuple[int, int]) -> dict[str, Array]:
    """``D``, ``V_D``, ``S`` and ``S_corr`` of a window by the fitted kernel
    (``kernelfit.FittedKernels``; the window's pixel ``[0, 0]`` is image pixel ``origin``):
    ``D_raw = s (Y - sum_i p_i (K_i * X) - sum_j g_j p_j)`` (``X`` the convolved image,
    ``s`` +1 when it is the reference, -1 when the target), decorrelated by ``phi`` and
    divided by ``sigma_d``; ``V_D`` its variance (``phi^2`` over ``V_Y``, ``(phi * K)^2``
    over ``V_X`` scaled by the kernel's norm at each pixel); ``S`` the matched filter of
    ``D`` with ``P_D`` times ``F_D``, ``S_corr`` over its noise. Inputs and outputs as
    ``apply``'s: ``(ly, lx)`` in, ``(ly - 2 H, lx - 2 H)`` out."""
    from outcore.diffim.basis import monomials

    xp = array_namespace(reference)
    fft = backend_fft(xp)
    half = kernels.half_width
    ly, lx = reference.shape
    shape = (fft.next_fast_len(ly, real=True), fft.next_fast_len(lx, real=True))
    crop = np.s_[half: ly - half, half: lx - half]
    ny, nx = kernels.shape
    powers = max(2 * kernels.degree, kernels.background_degree)
    rows = _powers(ly, ny, origin[0], powers, xp)
    cols = _powers(lx, nx, origin[1], powers, xp)
    image, other = (reference, target) if kernels.convolved == "reference" else (target,
                                                                                 reference)
    var_image, var_other = (var_r, var_n) if kernels.convolved == "reference" else (var_n,
                                                                                    var_r)

    def convolved(spectrum: Array, kernel: np.ndarray) -> Array:
        out = kernel_hat(kernel, shape, xp)
        out *= spectrum
        return fft.irfft2(out, s=shape)[:ly, :lx]

    image_hat = fft.rfft2(image, s=shape)
    model = xp.zeros((ly, lx))
    for kernel, (a, b) in zip(kernels.kernels, monomials(kernels.degree), strict=True):
        model += convolved(image_hat, kernel) * (rows[b][:, None] * cols[a][None, :])
    del image_hat
    for value, (a, b) in zip(kernels.background, monomials(kernels.background_degree),
                             strict=True):
        model += float(value) * (rows[b][:, None] * cols[a][None, :])
    raw = other - model if kernels.convolved == "reference" else model - other
    del model
    raw_hat = fft.rfft2(raw, s=shape)
    del raw
    raw_hat *= kernel_hat(kernels.decorrelation, shape, xp)
    out = {"difference": xp.ascontiguousarray(
        fft.irfft2(raw_hat, s=shape)[crop] / kernels.sigma_d)}
    raw_hat *= kernel_hat(kernels.psf_d[::-1, ::-1], shape, xp)
    out["score"] = xp.ascontiguousarray(
        fft.irfft2(raw_hat, s=shape)[crop] * (kernels.f_d / kernels.sigma_d))
    del raw_hat
    phi2, matched2 = kernels.decorrelation**2, kernels.matched**2
    variance = convolved(fft.rfft2(var_other, s=shape), phi2)
    spread = xp.zeros((ly, lx))  # |phi * K_x|^2 / |phi * K_c|^2 at each pixel
    terms = monomials(kernels.degree)
    for i, (a, b) in enumerate(terms):
        for j, (c, d) in enumerate(terms):
            spread += float(kernels.variance_form[i, j]) * (rows[b + d][:, None]
                                                            * cols[a + c][None, :])
    variance += convolved(fft.rfft2(var_image, s=shape), matched2) * spread
    variance /= kernels.sigma_d**2
    var_s = convolved(fft.rfft2(variance, s=shape), kernels.psf_d[::-1, ::-1] ** 2)
    var_s *= kernels.f_d**2 * kernels.noise[1]
    out["variance"] = xp.maximum(xp.ascontiguousarray(variance[crop]) * kernels.noise[0], 0.0)
    var_s = xp.ascontiguousarray(var_s[crop])
    floor = 1e-12 * float(xp.max(xp.abs(var_s))) if var_s.size else 0.0
    ok = var_s > floor
    out["score_corr"] = xp.where(ok, out["score"] / xp.sqrt(xp.where(ok, var_s, 1.0)), 0.0)
    return out
