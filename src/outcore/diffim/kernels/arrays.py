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
