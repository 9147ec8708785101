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

The variance kernels of ``D`` and of ``S`` are scaled by factors measured on a sample of the
pair (``outcore.diffim.calibrate``) when the inputs' noise is not white (resampled or
stacked images), so ``S_corr`` and ``D / sqrt(V_D)`` keep unit spread there too.

``pair_kernels`` builds the kernels once per pair on a periodic grid and crops them in real
space at the half width ``H`` outside which every kernel's absolute sum is below
``TRUNCATION`` of its total; the score kernels' ``reach`` (outside which their absolute sum
is below ``REACH_TAIL``) is how far a bad pixel or an image edge spoils the score, the
border that is not searched. ``outcore.diffim.kernels.arrays.apply`` convolves a window by FFT
(scipy.fft on the host, cupyx.scipy.fft on a GPU) and returns the outputs ``H`` pixels in
from the window's edges, which depend on the window's pixels only, so tiles with a halo of
``H`` give every output pixel exactly as the whole image would.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import scipy.fft

#: Relative absolute sum of a kernel allowed outside its crop.
TRUNCATION = 1e-6
#: Relative absolute sum of the score kernels beyond their ``reach``: a star's light cut by
#: an edge or a bad pixel farther away moves its score by under this fraction of its own
#: significance (a thousandth of a 1000-sigma star's is 1 sigma, under any threshold).
REACH_TAIL = 1e-3


@dataclass(frozen=True)
class ZogyKernels:
    """The real-space kernels of one pair, each ``(2 H + 1, 2 H + 1)`` float64 centred on its
    middle pixel: ``dn``, ``dr`` (D from N and R), ``sn``, ``sr`` (S from N and R),
    ``psf_d`` (of unit sum for PSFs of unit sum; the fraction they hold for PSFs cut
    from wider ones), and the zero point ``f_d``; ``reach`` (pixels, at most ``H``) the
    half width holding all but ``REACH_TAIL`` of the score kernels; ``noise`` the factors
    of ``V_D`` and ``V_S`` for noise that is not white (1, 1 for white noise; see
    ``calibrate``)."""

    dn: np.ndarray
    dr: np.ndarray
    sn: np.ndarray
    sr: np.ndarray
    psf_d: np.ndarray
    f_d: float
    reach: int
    noise: tuple[float, float] = (1.0, 1.0)

    @property
    def half_width(self) -> int:
        return self.dn.shape[0] // 2

    def with_noise(self, difference: float, score: float) -> ZogyKernels:
        """These kernels with ``V_D`` scaled by ``difference`` and ``V_S`` by ``score``."""
        return replace(self, noise=(difference, score))

    def variance_kernels(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The kernels of ``V_D`` from ``V_n`` and ``V_r``, then of ``V_S``: each kernel
        squared, times its noise factor."""
        f_d, f_s = self.noise
        return self.dn**2 * f_d, self.dr**2 * f_d, self.sn**2 * f_s, self.sr**2 * f_s

    @property
    def score_norm(self) -> float:
        """``F_S = F_D^2 sum(P_D^2)``: ``S`` at a source of flux ``a`` is ``a F_S`` and its
        background variance ``F_S``."""
        return self.f_d**2 * float((self.psf_d**2).sum())


def centred(psf: np.ndarray, grid: int) -> np.ndarray:
    """``psf`` (odd sides) on a ``grid x grid`` periodic grid with its middle pixel at 0."""
    py, px = psf.shape
    out = np.zeros((grid, grid))
    out[:py, :px] = psf
    return np.roll(out, (-(py // 2), -(px // 2)), axis=(0, 1))


def crop_periodic(kernel: np.ndarray, half: int) -> np.ndarray:
    """The ``(2 half + 1)^2`` middle of a periodic kernel whose centre is at index 0."""
    shifted = np.fft.fftshift(kernel)
    c = kernel.shape[0] // 2
    return shifted[c - half: c + half + 1, c - half: c + half + 1].copy()


def half_width_of(kernels: list[np.ndarray], tail: float = TRUNCATION) -> int:
    """The smallest half width whose crop keeps all but ``tail`` of every kernel's absolute
    sum."""
    grid = kernels[0].shape[0]
    needed = 1
    for kernel in kernels:
        weight = np.abs(np.fft.fftshift(kernel))
        c = grid // 2
        y, x = np.indices(weight.shape)
        ring = np.maximum(np.abs(y - c), np.abs(x - c))
        outside = weight.sum() - np.cumsum(np.bincount(ring.ravel(), weight.ravel()))
        needed = max(needed, int(np.argmax(outside <= tail * weight.sum())))
    return needed


def pair_kernels(psf_r: np.ndarray, psf_n: np.ndarray, sigma_r: float, sigma_n: float,
                 f_r: float = 1.0, f_n: float = 1.0) -> ZogyKernels:
    """The ZOGY kernels of a pair (see the module docstring), from unit-sum PSF stamps of
    odd sides, background noise ``sigma_*`` and zero points ``f_*`` (image units)."""
    grid = scipy.fft.next_fast_len(max(64, 4 * max(*psf_r.shape, *psf_n.shape)))
    pr = np.fft.fft2(centred(psf_r, grid))
    pn = np.fft.fft2(centred(psf_n, grid))
    den = sigma_n**2 * f_r**2 * np.abs(pr) ** 2 + sigma_r**2 * f_n**2 * np.abs(pn) ** 2
    root = np.sqrt(np.maximum(den, np.finfo(float).tiny))
    f_d = f_r * f_n / math.sqrt(sigma_n**2 * f_r**2 + sigma_r**2 * f_n**2)
    psf_d_hat = f_r * f_n * pr * pn / (f_d * root)
    dn_hat, dr_hat = f_r * pr / root, f_n * pn / root
    matched = f_d * np.conj(psf_d_hat)
    spaces = [np.fft.ifft2(k).real for k in
              (dn_hat, dr_hat, matched * dn_hat, matched * dr_hat, psf_d_hat)]
    half = min(half_width_of(spaces[:4]), grid // 2 - 1)
    reach = min(half_width_of(spaces[2:4], REACH_TAIL), half)
    dn, dr, sn, sr, psf_d = (crop_periodic(k, half) for k in spaces)
    return ZogyKernels(dn, dr, sn, sr, psf_d, f_d, reach)
