"""The host twin of difference imaging's kernels: ZOGY, the fitted kernel's subtraction and
its fit's sums on windows held on the host.

The window is already where the array code runs (numpy, ``scipy.fft``), so each function is
``arrays``' own; the GPU twin moves the window to the device and back.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from outcore.diffim.kernels import arrays
from outcore.diffim.zogy import ZogyKernels


def subtract(reference: np.ndarray, target: np.ndarray, var_r: np.ndarray, var_n: np.ndarray,
             kernels: ZogyKernels) -> dict[str, np.ndarray]:
    """``D``, ``V_D``, ``S`` and ``S_corr`` of a host window (``arrays.apply``), on the host."""
    return arrays.apply(reference, target, var_r, var_n, kernels)


def subtract_fitted(reference: np.ndarray, target: np.ndarray, var_r: np.ndarray,
                    var_n: np.ndarray, kernels: Any, origin: tuple[int, int]
                    ) -> dict[str, np.ndarray]:
    """The same by a fitted kernel (``arrays.apply_fitted``), on the host."""
    return arrays.apply_fitted(reference, target, var_r, var_n, kernels, origin)


def fit_normal_equations(image: np.ndarray, target: np.ndarray, weight: np.ndarray,
                         ys: np.ndarray, xs: np.ndarray, terms: np.ndarray,
                         background: np.ndarray, functions: np.ndarray, half: int
                         ) -> tuple[np.ndarray, np.ndarray, float]:
    """A fit's normal equations over host pixels (``arrays.normal_equations``)."""
    return arrays.normal_equations(image, target, weight, ys, xs, terms, background,
                                   functions, half)


def fit_stamp_sums(image: np.ndarray, target: np.ndarray, weight: np.ndarray,
                   ys: np.ndarray, xs: np.ndarray, labels: np.ndarray, count: int,
                   terms: np.ndarray, background: np.ndarray, functions: np.ndarray,
                   half: int, coefficients: np.ndarray) -> np.ndarray:
    """Each stamp's sums under a fit (``arrays.stamp_sums``)."""
    return arrays.stamp_sums(image, target, weight, ys, xs, labels, count, terms, background,
                             functions, half, coefficients)
