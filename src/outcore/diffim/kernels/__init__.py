"""Difference imaging's kernels: the subtraction of one window of a tile, and the fit of a
matching kernel, on the host or a GPU.

``subtract`` gives ``D``, ``V_D``, ``S`` and ``S_corr`` of a host window on the backend the
run resolved (``backend.kernels_named``), by ZOGY (``zogy.ZogyKernels``) or by a fitted
kernel (``kernelfit.FittedKernels``); ``fit_normal_equations`` and ``fit_stamp_sums`` are the
fit's sums over its stamps. ``cpu.py`` runs the array code where the window is, ``gpu.py``
copies it to the device, runs it there and copies the results back. The array code is
``arrays.py``'s (written once against numpy or cupy): they differ only in their FFT module
(``backend.fft``) and in where the window lies. ``tests/test_diffim_kernels.py`` compares
the twins. Reading, background, detection and measurement are host code (``tile``,
``background``, ``detect``, ``measure``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from outcore.backend import kernels_named, resolve
from outcore.diffim.zogy import ZogyKernels


def subtract(reference: np.ndarray, target: np.ndarray, var_r: np.ndarray, var_n: np.ndarray,
             kernels: Any, backend: str, origin: tuple[int, int] = (0, 0)
             ) -> dict[str, np.ndarray]:
    """``D``, ``V_D``, ``S`` and ``S_corr`` (float64, on the host) of a window, computed on
    ``backend`` (``numpy``, ``cupy`` or ``auto``; ``backend.resolve`` refuses cupy without a
    GPU) with ZOGY's ``kernels`` or a fitted kernel's (whose polynomials need the window's
    ``origin``, the image pixel of its ``[0, 0]``).

    The inputs are background-subtracted ``(ly, lx)`` host windows of the reference and the
    target and their variances, zero (value and variance) where a pixel is bad or outside
    the image; the outputs are ``(ly - 2 H, lx - 2 H)`` (``arrays.apply``)."""
    twin = kernels_named(resolve(backend), __name__)
    if isinstance(kernels, ZogyKernels):
        return twin.subtract(reference, target, var_r, var_n, kernels)
    return twin.subtract_fitted(reference, target, var_r, var_n, kernels, origin)


def fit_normal_equations(image: np.ndarray, target: np.ndarray, weight: np.ndarray,
                         ys: np.ndarray, xs: np.ndarray, terms: np.ndarray,
                         background: np.ndarray, functions: np.ndarray, half: int,
                         backend: str) -> tuple[np.ndarray, np.ndarray, float]:
    """The normal equations of a fit over the pixels ``(ys, xs)`` of a host window
    (``arrays.normal_equations``), computed on ``backend``, returned on the host."""
    twin = kernels_named(resolve(backend), __name__)
    return twin.fit_normal_equations(image, target, weight, ys, xs, terms, background,
                                     functions, half)


def fit_stamp_sums(image: np.ndarray, target: np.ndarray, weight: np.ndarray,
                   ys: np.ndarray, xs: np.ndarray, labels: np.ndarray, count: int,
                   terms: np.ndarray, background: np.ndarray, functions: np.ndarray,
                   half: int, coefficients: np.ndarray, backend: str) -> np.ndarray:
    """Each stamp's chi2, pixels and sums of residual, model and variance under a fit
    (``arrays.stamp_sums``), computed on ``backend``, returned on the host."""
    twin = kernels_named(resolve(backend), __name__)
    return twin.fit_stamp_sums(image, target, weight, ys, xs, labels, count, terms,
                               background, functions, half, coefficients)
