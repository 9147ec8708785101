"""The bases of a fitted matching kernel and the polynomials of its spatial variation.

A kernel-fitting subtraction (``outcore.diffim.kernelfit``) models the image ``Y`` as the
image ``X`` convolved with a kernel that varies over the image, plus a smooth background:

``Y(x) = kappa (b_0 * X)(x) + sum_k sum_i c_ki p_i(x) (z_k * X)(x) + sum_j g_j p_j(x)``

with ``b_0`` a kernel of unit sum, ``z_k`` kernels of zero sum (so the kernel's sum, the
flux ratio ``kappa``, is the same everywhere, as one exposure's photometric scale is),
``p_i`` the monomials ``u^a v^b`` of total degree at most ``degree`` in the position scaled
to [-1, 1] over the whole image (so a pixel's polynomial does not depend on the tile that
asks). Two bases span the kernels:

- ``delta``: one delta function per pixel of the ``(2 w + 1)^2`` kernel (sfft's, Hu et al.
  2022; Bramich 2008): any kernel that size, sub-pixel shifts and the sharp kernels of
  undersampled images included; ``(2 w + 1)^2`` functions, so kept for small ``w``;
- ``gaussian``: Gaussians times polynomials (Alard & Lupton 1998; HOTPANTS' three widths of
  degrees 6, 4 and 2), 49 functions whatever ``w``, scaled to the matching kernel's width.

Either set is rearranged once into ``unit`` (sum 1) and ``zero_sum`` (orthonormal, each of
sum 0) spanning the same kernels, which keeps the normal equations well conditioned. The
convolution is ``(K * X)(y, x) = sum K[dy, dx] X(y - dy, x - dx)`` over offsets ``|dy|,
|dx| <= w``, ``K[dy, dx]`` stored at ``[dy + w, dx + w]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["BASES", "KernelBasis", "choose_basis", "monomials", "position_terms"]

#: The bases a fit may use; ``auto`` takes ``delta`` for undersampled images, else
#: ``gaussian`` (``choose_basis``).
BASES = ("auto", "delta", "gaussian")
#: Below this FWHM (pixels) of the broader image an image is undersampled: ``auto`` takes the
#: delta basis, whose kernel is small there.
UNDERSAMPLED_FWHM = 3.0
#: Half width of a delta basis: this many FWHM of the broader image, within the bounds.
DELTA_HALF_FWHM = 2.0
DELTA_HALF_BOUNDS = (3, 6)
#: Alard-Lupton's Gaussians: widths in units of the matching kernel's sigma (at least
#: ``SIGMA_FLOOR`` px) and their polynomial degrees (HOTPANTS' defaults).
GAUSSIAN_WIDTHS = (0.5, 1.0, 2.0)
GAUSSIAN_DEGREES = (6, 4, 2)
SIGMA_FLOOR = 0.7
#: Half width of a Gaussian basis: its widest Gaussian to this many sigma, within the bounds.
GAUSSIAN_REACH = 3.0
GAUSSIAN_HALF_BOUNDS = (3, 15)
#: Singular values below this fraction of the largest drop a dependent kernel of the set.
RANK_TOLERANCE = 1e-9
_FWHM_SIGMA = 2 * math.sqrt(2 * math.log(2))


def monomials(degree: int) -> list[tuple[int, int]]:
    """The exponents ``(a, b)`` of ``u^a v^b`` of total degree at most ``degree``, by
    degree: ``(0, 0), (1, 0), (0, 1), (2, 0), (1, 1), (0, 2), ...``; a lower degree's are a
    prefix of a higher's."""
    return [(a, total - a) for total in range(degree + 1) for a in range(total, -1, -1)]


def scaled(index: np.ndarray, size: int) -> np.ndarray:
    """Pixel indices along an image axis of ``size`` pixels scaled to [-1, 1] (0 at the
    middle)."""
    half = (size - 1) / 2
    return (np.asarray(index, dtype=np.float64) - half) / max(half, 1.0)


def position_terms(ys: np.ndarray, xs: np.ndarray, shape: tuple[int, int],
                   degree: int) -> np.ndarray:
    """``(n, terms)``: the monomials of ``degree`` at image pixels ``(ys, xs)`` of an image
    of ``shape``."""
    u, v = scaled(xs, shape[1]), scaled(ys, shape[0])
    return np.stack([u**a * v**b for a, b in monomials(degree)], axis=-1)


@dataclass(frozen=True)
class KernelBasis:
    """A basis of ``(2 half + 1)^2`` kernels: ``unit`` (flattened, sum 1) and ``zero_sum``
    ``(n, (2 half + 1)^2)`` (orthonormal rows of sum 0); ``kind`` and, for Gaussians, their
    ``sigmas`` (pixels)."""

    kind: str
    half: int
    unit: np.ndarray
    zero_sum: np.ndarray
    sigmas: tuple[float, ...] = ()

    @property
    def side(self) -> int:
        return 2 * self.half + 1

    @property
    def size(self) -> int:
        """Kernels in the basis: the unit one and the zero-sum ones."""
        return 1 + self.zero_sum.shape[0]

    def summary(self) -> dict:
        return {"kind": self.kind, "half_width": self.half, "functions": self.size,
                "sigmas": [round(s, 3) for s in self.sigmas]}


def _offsets(half: int) -> tuple[np.ndarray, np.ndarray]:
    o = np.arange(-half, half + 1, dtype=np.float64)
    return np.meshgrid(o, o, indexing="ij")


def _rearranged(kind: str, half: int, functions: np.ndarray,
                sigmas: tuple[float, ...] = ()) -> KernelBasis:
    """``functions`` ``(n, side^2)`` as a unit kernel (the one of largest sum, scaled to 1)
    and an orthonormal zero-sum set spanning the rest (each less its sum times the unit
    kernel; the SVD drops dependent ones), the unit kernel then made orthogonal to them."""
    sums = functions.sum(axis=1)
    j = int(np.argmax(np.abs(sums)))
    unit = functions[j] / sums[j]
    rest = np.delete(functions - sums[:, None] * unit[None, :], j, axis=0)
    _, values, rows = np.linalg.svd(rest, full_matrices=False)
    zero_sum = rows[values > RANK_TOLERANCE * values[0]]
    unit = unit - zero_sum.T @ (zero_sum @ unit)
    return KernelBasis(kind, half, unit, zero_sum, sigmas)


def delta_basis(half: int) -> KernelBasis:
    """One delta function per kernel pixel."""
    return _rearranged("delta", half, np.eye((2 * half + 1) ** 2))


def gaussian_basis(half: int, sigmas: tuple[float, ...],
                   degrees: tuple[int, ...] = GAUSSIAN_DEGREES) -> KernelBasis:
    """Alard-Lupton's ``exp(-r^2 / 2 s^2) (x / s)^a (y / s)^b`` for each width ``s`` with
    ``a + b`` up to its degree."""
    dy, dx = _offsets(half)
    rows = []
    for sigma, degree in zip(sigmas, degrees, strict=True):
        g = np.exp(-(dx**2 + dy**2) / (2 * sigma**2))
        rows += [(g * (dx / sigma) ** a * (dy / sigma) ** b).ravel()
                 for a, b in monomials(degree)]
    return _rearranged("gaussian", half, np.array(rows), tuple(sigmas))


def choose_basis(kind: str, fwhm_convolved: float, fwhm_matched: float) -> KernelBasis:
    """The basis ``kind`` (``BASES``) for a kernel that takes an image of PSF FWHM
    ``fwhm_convolved`` (pixels) to one of ``fwhm_matched``: ``auto`` is ``delta`` below
    ``UNDERSAMPLED_FWHM``, else ``gaussian``. A delta basis reaches ``DELTA_HALF_FWHM``
    FWHM; Gaussians are scaled to the matching kernel's sigma ``sqrt(s_m^2 - s_c^2)`` (at
    least ``SIGMA_FLOOR``) and reach ``GAUSSIAN_REACH`` of their widest sigma."""
    broad = max(fwhm_convolved, fwhm_matched)
    if kind == "auto":
        kind = "delta" if broad < UNDERSAMPLED_FWHM else "gaussian"
    if kind == "delta":
        lo, hi = DELTA_HALF_BOUNDS
        return delta_basis(min(max(math.ceil(DELTA_HALF_FWHM * broad), lo), hi))
    matching = math.sqrt(max(fwhm_matched**2 - fwhm_convolved**2, 0.0)) / _FWHM_SIGMA
    sigma = max(matching, SIGMA_FLOOR)
    sigmas = tuple(f * sigma for f in GAUSSIAN_WIDTHS)
    lo, hi = GAUSSIAN_HALF_BOUNDS
    half = min(max(math.ceil(GAUSSIAN_REACH * sigmas[-1]), lo), hi)
    return gaussian_basis(half, sigmas)


def largest_half(kind: str) -> int:
    """The largest half width a basis of ``kind`` can have (the plan's bound)."""
    if kind == "delta":
        return DELTA_HALF_BOUNDS[1]
    return max(DELTA_HALF_BOUNDS[1], GAUSSIAN_HALF_BOUNDS[1])
