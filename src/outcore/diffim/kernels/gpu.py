"""The device twin of difference imaging's kernels: ZOGY, the fitted kernel's subtraction and
its fit's sums on a GPU, for windows held on the host.

The tile reads, subtracts its background and detects on the host; only the array work runs
on the device: each function copies its window (and the fit's pixels and basis) there, runs
the array code of ``arrays`` (whose FFTs are ``cupyx.scipy.fft``'s, through ``backend.fft``)
and copies the results back. cupy is imported inside the functions, so this module imports
without it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from outcore.diffim.kernels import arrays
from outcore.diffim.zogy import ZogyKernels


def subtract(reference: np.ndarray, target: np.ndarray, var_r: np.ndarray, var_n: np.ndarray,
             kernels: ZogyKernels) -> dict[str, np.ndarray]:
    """``D``, ``V_D``, ``S`` and ``S_corr`` of a host window, computed on the device
    (``arrays.apply`` on cupy copies of the window), returned on the host."""
    import cupy

    windows = [cupy.asarray(a) for a in (reference, target, var_r, var_n)]
    out = arrays.apply(*windows, kernels)
    del windows
    return {name: cupy.asnumpy(values) for name, values in out.items()}


def subtract_fitted(reference: np.ndarray, target: np.ndarray, var_r: np.ndarray,
                    var_n: np.ndarray, kernels: Any, origin: tuple[int, int]
                    ) -> dict[str, np.ndarray]:
    """The same by a fitted kernel (``arrays.apply_fitted`` on cupy copies), on the host."""
    import cupy

    windows = [cupy.asarray(a) for a in (reference, target, var_r, var_n)]
    out = arrays.apply_fitted(*windows, kernels, origin)
    del windows
    return {name: cupy.asnumpy(values) for name, values in out.items()}


def fit_normal_equations(image: np.ndarray, target: np.ndarray, weight: np.ndarray,
                         ys: np.ndarray, xs: np.ndarray, terms: np.ndarray,
                         background: np.ndarray, functions: np.ndarray, half: int
                         ) -> tuple[np.ndarray, np.ndarray, float]:
    """A fit's normal equations (``arrays.normal_equations`` on cupy copies of the window,
    pixels and basis), returned on the host."""
    import cupy

    args = [cupy.asarray(a) for a in (image, target, weight, ys, xs, terms, background,
                                      functions)]
    normal, right, total = arrays.normal_equations(*args, half)
    return cupy.asnumpy(normal), cupy.asnumpy(right), total


def fit_stamp_sums(image: np.ndarray, target: np.ndarray, weight: np.ndarray,
                   ys: np.ndarray, xs: np.ndarray, labels: np.ndarray, count: int,
                   terms: np.ndarray, background: np.ndarray, functions: np.ndarray,
                   half: int, coefficients: np.ndarray) -> np.ndarray:
    """Each stamp's sums under a fit (``arrays.stamp_sums`` on cupy copies), returned on the
    host."""
    import cupy

    args = [cupy.asarray(a) for a in (image, target, weight, ys, xs, labels)]
    rest = [cupy.asarray(a) for a in (terms, background, functions)]
    return cupy.asnumpy(arrays.stamp_sums(*args, count, *rest, half,
                                          cupy.asarray(coefficients)))
