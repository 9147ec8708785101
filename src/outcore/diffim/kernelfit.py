"""The kernel-fitting subtraction: a matching kernel fitted to the pair, then its difference
decorrelated, with the variance and the PSF the later stages need.

The model (``outcore.diffim.basis``): the image ``Y`` is the image ``X`` convolved with a
kernel ``K_x = sum_i p_i(x) K_i`` that varies over the image as polynomials ``p_i`` of the
position, plus a polynomial background; ``X`` is the sharper image (the reference, unless
the target is sharper), so the kernel only ever blurs. Its coefficients are the weighted
least-squares solution over the pixels of static sources in both images
(``outcore.diffim.fitstamps``), whose normal equations are summed over fixed blocks of the
image and solved here once (``solve``), so one kernel holds for every tile and none leaves a
seam.

``fitted_kernels`` turns the solution into what a tile applies
(``kernels.arrays.apply_fitted``):

- ``D_raw = s (Y - K * X - background)`` (``s`` = +1 when ``X`` is the reference, -1 when it
  is the target, so a new source is positive); its noise is correlated by the kernel;
- the decorrelation of Alard-Lupton differences (Kaiser 2004; Reiss & Lupton 2016), from the
  kernel at the image's centre ``K_c``: ``phi^ = sqrt((s_Y^2 + kappa^2 s_X^2) / (s_Y^2 +
  s_X^2 |K_c^|^2))``, unit sum, so ``phi * D_raw`` has white noise of variance ``s_D^2 =
  s_Y^2 + kappa^2 s_X^2``, and ``D = phi * D_raw / s_D`` is in units of its background sigma
  as ZOGY's is;
- ``V_D = (phi^2 * V_Y + n(x) (phi * K_c)^2 * V_X) / s_D^2``, with ``n(x) = |phi * K_x|^2 /
  |phi * K_c|^2``, the kernel's norm at each pixel (a quadratic form of the position terms);
- ``P_D = phi * P_Y`` (the PSF of ``Y``, its normalisation kept), ``F_D = F / s_D`` with
  ``F`` the flux scale of ``Y`` to reference units (``kappa`` for the target, 1 for the
  reference), so a source of flux ``a`` in reference units is ``a F_D P_D`` in ``D``, as
  for ZOGY; the score ``S`` is ``D`` filtered with ``P_D``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import scipy.fft
from scipy.linalg import LinAlgError, cho_factor, cho_solve

from outcore.diffim.basis import KernelBasis, monomials
from outcore.diffim.zogy import REACH_TAIL, centred, crop_periodic, half_width_of

#: Relative absolute sum of ``phi`` and of ``P_D`` left outside their crops: it moves the
#: noise of ``D`` from white, and fluxes, by about as much.
TAIL = 1e-4
#: ``phi`` is cut at this many of the kernel's half widths at most (``P_D`` at ``phi``'s
#: plus the PSF's), so the plan can bound a tile's halo before the fit.
PHI_REACH = 2
#: The diagonal of the scaled normal equations is raised by this fraction, so that a basis
#: direction no stamp constrains gets a zero coefficient instead of a singular solve.
RIDGE = 1e-10


@dataclass(frozen=True)
class FittedKernels:
    """What a tile applies: ``convolved`` (``reference`` or ``target``: ``X``), the image
    ``shape`` (for the position terms), ``degree`` and ``background_degree``, ``kernels``
    ``(terms, 2 w + 1, 2 w + 1)`` (``K_i``, the unit kernel's ``kappa`` in the first),
    ``background`` (its coefficients), ``decorrelation`` (``phi``), ``matched``
    (``phi * K_c``), ``variance_form`` (``<phi * K_i, phi * K_j> / |phi * K_c|^2``),
    ``psf_d`` (``P_D``), ``f_d``, ``sigma_d`` (image units), ``reach`` (pixels: the score
    kernels' reach) and ``noise`` (the factors of ``V_D`` and ``V_S``, see ``calibrate``)."""

    convolved: str
    shape: tuple[int, int]
    degree: int
    background_degree: int
    kernels: np.ndarray
    background: np.ndarray
    decorrelation: np.ndarray
    matched: np.ndarray
    variance_form: np.ndarray
    psf_d: np.ndarray
    f_d: float
    sigma_d: float
    reach: int
    noise: tuple[float, float] = (1.0, 1.0)

    @property
    def half_width(self) -> int:
        """Pixels a window loses at each edge: the kernel's, ``phi``'s and ``P_D``'s half
        widths."""
        return sum(k.shape[-1] // 2 for k in (self.kernels, self.decorrelation, self.psf_d))

    def with_noise(self, difference: float, score: float) -> FittedKernels:
        """These kernels with ``V_D`` scaled by ``difference`` and ``V_S`` by ``score``."""
        return replace(self, noise=(difference, score))


@dataclass(frozen=True)
class Solution:
    """The solved fit: ``coefficients`` (``kappa``, the zero-sum kernels' terms kernel by
    kernel, the background's), ``kappa_error`` (its standard error, scaled by the reduced
    chi2), ``chi2``, ``pixels`` and the ``degree`` solved for."""

    coefficients: np.ndarray
    kappa_error: float
    chi2: float
    pixels: int
    degree: int

    @property
    def reduced_chi2(self) -> float:
        return self.chi2 / max(self.pixels - self.coefficients.size, 1)


def unknowns(basis: KernelBasis, degree: int) -> int:
    """The coefficients of a fit: ``kappa``, every zero-sum kernel's position terms and the
    background's (of the same degree)."""
    terms = len(monomials(degree))
    return 1 + (basis.size - 1) * terms + terms


def subset(basis: KernelBasis, degree: int, lower: int) -> np.ndarray:
    """The indices, among the coefficients of ``degree``, of those of a fit of degree
    ``lower`` (its monomials are a prefix of the higher degree's)."""
    terms, kept = len(monomials(degree)), len(monomials(lower))
    zero_sum = [1 + k * terms + i for k in range(basis.size - 1) for i in range(kept)]
    background = [1 + (basis.size - 1) * terms + j for j in range(kept)]
    return np.array([0, *zero_sum, *background])


def solve(normal: np.ndarray, right: np.ndarray, total: float, pixels: int,
          degree: int) -> Solution:
    """The weighted least-squares coefficients from summed normal equations ``A^T W A``,
    ``A^T W y`` and ``y^T W y`` over ``pixels`` pixels (a Cholesky solve of the equations
    scaled to unit diagonal, raised by ``RIDGE``), with ``kappa``'s standard error."""
    scale = np.sqrt(np.maximum(np.diag(normal), np.finfo(float).tiny))
    scaled = normal / np.outer(scale, scale) + RIDGE * np.eye(normal.shape[0])
    try:
        factor = cho_factor(scaled, check_finite=False)
        coefficients = cho_solve(factor, right / scale) / scale
        unit = np.zeros(normal.shape[0])
        unit[0] = 1.0
        variance = float(cho_solve(factor, unit)[0]) / scale[0] ** 2
    except LinAlgError:
        inverse = np.linalg.pinv(scaled)
        coefficients = inverse @ (right / scale) / scale
        variance = float(inverse[0, 0]) / scale[0] ** 2
    chi2 = max(float(total - 2 * coefficients @ right + coefficients @ normal @ coefficients),
               0.0)
    reduced = chi2 / max(pixels - coefficients.size, 1)
    return Solution(coefficients, math.sqrt(max(variance, 0.0) * max(reduced, 1e-12)), chi2,
                    pixels, degree)


def coefficient_kernels(basis: KernelBasis, solution: Solution) -> tuple[np.ndarray,
                                                                         np.ndarray]:
    """``(K_i (terms, side, side), background coefficients)`` of a solution."""
    terms = len(monomials(solution.degree))
    c = solution.coefficients
    zero_sum = c[1: 1 + (basis.size - 1) * terms].reshape(basis.size - 1, terms)
    kernels = (basis.zero_sum.T @ zero_sum).T.reshape(terms, basis.side, basis.side)
    kernels[0] += c[0] * basis.unit.reshape(basis.side, basis.side)
    return kernels, c[1 + (basis.size - 1) * terms:]


def _grid(*sides: int) -> int:
    return scipy.fft.next_fast_len(max(64, 4 * max(sides)))


def fitted_kernels(basis: KernelBasis, solution: Solution, convolved: str,
                   shape: tuple[int, int], sigma_x: float, sigma_y: float,
                   psf_y: np.ndarray) -> FittedKernels:
    """The ``FittedKernels`` of a solution (see the module docstring): ``X`` is the
    ``convolved`` image (``reference`` or ``target``), ``sigma_x``, ``sigma_y`` the
    background noise of ``X`` and ``Y`` (image units), ``psf_y`` the PSF of ``Y`` (odd
    sides, its sum the fraction of a source's flux it holds)."""
    kernels, background = coefficient_kernels(basis, solution)
    kappa = float(solution.coefficients[0])
    grid = _grid(basis.side, *psf_y.shape)
    spectra = [np.fft.fft2(centred(k, grid)) for k in kernels]
    sigma_d = math.sqrt(sigma_y**2 + kappa**2 * sigma_x**2)
    phi_hat = sigma_d / np.sqrt(sigma_y**2 + sigma_x**2 * np.abs(spectra[0]) ** 2)
    phi = np.fft.ifft2(phi_hat).real
    matched_full = np.fft.ifft2(phi_hat * spectra[0]).real
    psf_full = np.fft.ifft2(phi_hat * np.fft.fft2(centred(psf_y, grid))).real
    # the score's kernels on X and on Y: P_D flipped (its spectrum conjugated) after each
    score_y = np.fft.ifft2(phi_hat * np.conj(np.fft.fft2(psf_full))).real
    score_x = np.fft.ifft2(np.fft.fft2(score_y) * spectra[0]).real
    phi_half = min(half_width_of([phi], TAIL), PHI_REACH * basis.half, grid // 2 - 1)
    psf_half = min(half_width_of([psf_full], TAIL), phi_half + psf_y.shape[0] // 2,
                   grid // 2 - 1)
    outer = [np.fft.ifft2(phi_hat * s).real for s in spectra]
    form = np.array([[float((a * b).sum()) for b in outer] for a in outer])
    full = basis.half + phi_half + psf_half
    reach = min(half_width_of([score_x, score_y], REACH_TAIL), full)
    flux_scale = kappa if convolved == "reference" else 1.0
    return FittedKernels(
        convolved, tuple(shape), solution.degree, solution.degree, kernels, background,
        crop_periodic(phi, phi_half), crop_periodic(matched_full, basis.half + phi_half),
        form / form[0, 0], crop_periodic(psf_full, psf_half), flux_scale / sigma_d, sigma_d,
        reach)
