"""The host twin of difference imaging's kernels: ZOGY on a window held on the host.

The window is already where the array code runs (numpy, ``scipy.fft``), so ``subtract`` is
``arrays.apply`` itself; the GPU twin moves the window to the device and back.
"""

from __future__ import annotations

import numpy as np

from outcore.diffim.kernels import arrays
from outcore.diffim.zogy import ZogyKernels


def subtract(reference: np.ndarray, target: np.ndarray, var_r: np.ndarray, var_n: np.ndarray,
             kernels: ZogyKernels) -> dict[str, np.ndarray]:
    """``D``, ``V_D``, ``S`` and ``S_corr`` of a host window (``arrays.apply``), on the host."""
    return arrays.apply(reference, target, var_r, var_n, kernels)
