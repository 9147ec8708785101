"""ZOGY (Zackay, Ofek & Gal-Yam 2016, ApJ 830, 27): the proper difference image and its score.

With ``R`` and ``N`` the background-subtracted reference and target (new) images, ``P_r`` and
``P_n`` their unit-sum PSFs, ``s_r`` and ``s_n`` their background noise and ``F_r``, ``F_n``
their flux zero points (here ``F_r = 1`` and ``F_n`` the flux ratio), in Fourier space
(``^`` a transform, ``den = s_n^2 F_r^2 |P_r^|^2 + s_r^2 F_n^2 |P_n^|^2``):

- ``D^ = (F_r P_r^ N^ - F_n P_n^ R^) / sqrt(den)``: the difference, white noise of unit
  variance where the background dominates (paper eq. 13);
- ``F_D = F_r F_n / sqrt(s_n^2 F_r^2 + s_r^2 F_n^2)`` and
  ``P_D^ = F_r F_n P_r^ P_n^ / (F_D sqrt(den))``: its flux zero point and PSF (eqs. 15-16);
- ``S = F_D D (x) P_D`` flipped, the matched-filter score; from the inputs
  ``S = k_n (x) N - k_r (x) R`` with ``k_n^ = F_D conj(P_D^) F_r P_r^ / sqrt(den)`` and
  ``k_r^ = F_D conj(P_D^) F_n P_n^ / sqrt(den)`` (eqs. 17, 25-26);
- ``S_corr = S / sqrt(V_n (x) k_n^2 + V_r (x) k_r^2)`` with the per-pixel variances ``V``
  of the inputs (source noise included when given), the score corrected for the local noise
  (eqs. 27-28; the astrometric term is left out: the images share their pixel grid);
- ``V_D = V_n (x) k_dn^2 + V_r (x) k_dr^2``, the variance image of ``D``, with ``k_dn`` and
  ``k_dr`` the kernels of ``D`` on ``N`` and ``R``.

``pair_kernels`` builds the kernels once per pair on a periodic grid and crops them in real
space at the half width ``H`` outside which every kernel's absolute sum is below
``TRUNCATION`` of its total; ``apply`` convolves a window by FFT (scipy.fft on the host,
cupy.fft on a GPU) and returns the outputs ``H`` pixels in from the window's edges, which
depend on the window's pixels only, so tiles with a halo of ``H`` give every output pixel
exactly as the whole image would.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np
import scipy.fft

from outcore.backend import array_namespace
from outcore.backend import fft as backend_fft

Array = Any
#: Relative absolute sum of a kernel allowed outside its crop.
TRUNCATION = 1e-6


@dataclass(frozen=True)
class ZogyKernels:
    """The real-space kernels of one pair, each ``(2 H + 1, 2 H + 1)`` float64 centred on its
    middle pixel: ``dn``, ``dr`` (D from N and R), ``sn``, ``sr`` (S from N and R),
    ``psf_d`` (unit sum), and the zero point ``f_d``."""

    dn: np.ndarray
    dr: np.ndarray
    sn: np.ndarray
    sr: np.ndarray
    psf_d: np.ndarray
    f_d: float

    @property
    def half_width(self) -> int:
        return self.dn.shape[0] // 2

    @property
    def score_norm(self) -> float:
        """``F_S = F_D^2 sum(P_D^2)``: ``S`` at a source of flux ``a`` is ``a F_S`` and its
        background variance ``F_S``."""
        return self.f_d**2 * float((self.psf_d**2).sum())


def _centred(psf: np.ndarray, grid: int) -> np.ndarray:
    """``psf`` (odd sides) on a ``grid x grid`` periodic grid with its middle pixel at 0."""
    py, px = psf.shape
    out = np.zeros((grid, grid))
    out[:py, :px] = psf
    return np.roll(out, (-(py // 2), -(px // 2)), axis=(0, 1))


def _crop(kernel: np.ndarray, half: int) -> np.ndarray:
    """The ``(2 half + 1)^2`` middle of a periodic kernel whose centre is at index 0."""
    shifted = np.fft.fftshift(kernel)
    c = kernel.shape[0] // 2
    return shifted[c - half: c + half + 1, c - half: c + half + 1].copy()


def _half_width(kernels: list[np.ndarray]) -> int:
    """The smallest half width whose crop keeps all but ``TRUNCATION`` of every kernel's
    absolute sum."""
    grid = kernels[0].shape[0]
    needed = 1
    for kernel in kernels:
        weight = np.abs(np.fft.fftshift(kernel))
        c = grid // 2
        y, x = np.indices(weight.shape)
        ring = np.maximum(np.abs(y - c), np.abs(x - c))
        outside = weight.sum() - np.cumsum(np.bincount(ring.ravel(), weight.ravel()))
        needed = max(needed, int(np.argmax(outside <= TRUNCATION * weight.sum())))
    return needed


def pair_kernels(psf_r: np.ndarray, psf_n: np.ndarray, sigma_r: float, sigma_n: float,
                 f_r: float = 1.0, f_n: float = 1.0) -> ZogyKernels:
    """The ZOGY kernels of a pair (see the module docstring), from unit-sum PSF stamps of
    odd sides, background noise ``sigma_*`` and zero points ``f_*`` (image units)."""
    grid = scipy.fft.next_fast_len(max(64, 4 * max(*psf_r.shape, *psf_n.shape)))
    pr = np.fft.fft2(_centred(psf_r, grid))
    pn = np.fft.fft2(_centred(psf_n, grid))
    den = sigma_n**2 * f_r**2 * np.abs(pr) ** 2 + sigma_r**2 * f_n**2 * np.abs(pn) ** 2
    root = np.sqrt(np.maximum(den, np.finfo(float).tiny))
    f_d = f_r * f_n / math.sqrt(sigma_n**2 * f_r**2 + sigma_r**2 * f_n**2)
    psf_d_hat = f_r * f_n * pr * pn / (f_d * root)
    dn_hat, dr_hat = f_r * pr / root, f_n * pn / root
    matched = f_d * np.conj(psf_d_hat)
    spaces = [np.fft.ifft2(k).real for k in
              (dn_hat, dr_hat, matched * dn_hat, matched * dr_hat, psf_d_hat)]
    half = min(_half_width(spaces[:4]), grid // 2 - 1)
    dn, dr, sn, sr, psf_d = (_crop(k, half) for k in spaces)
    return ZogyKernels(dn, dr, sn, sr, psf_d / psf_d.sum(), f_d)


def _kernel_hat(kernel: np.ndarray, shape: tuple[int, int], xp: ModuleType) -> Array:
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
        out = _kernel_hat(k_n, shape, xp)
        out *= n_hat
        other = _kernel_hat(k_r, shape, xp)
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
    out["variance"] = inverse(combine(kernels.dn**2, vn_hat, kernels.dr**2, vr_hat, 1))
    var_s = inverse(combine(kernels.sn**2, vn_hat, kernels.sr**2, vr_hat, 1))
    del vn_hat, vr_hat
    floor = 1e-12 * float(xp.max(xp.abs(var_s))) if var_s.size else 0.0
    ok = var_s > floor
    out["score_corr"] = xp.where(ok, out["score"] / xp.sqrt(xp.where(ok, var_s, 1.0)), 0.0)
    out["variance"] = xp.maximum(out["variance"], 0.0)
    return out
