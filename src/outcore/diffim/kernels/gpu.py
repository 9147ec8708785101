"""The device twin of difference imaging's kernels: ZOGY on a GPU for a window held on the
host.

The tile reads, subtracts its background and detects on the host; only the FFT work runs on
the device: ``subtract`` copies the four windows there, runs the array code of ``arrays``
(whose FFTs are ``cupyx.scipy.fft``'s, through ``backend.fft``) and copies the four results
back. cupy is imported inside the function, so this module imports without it.
"""

from __future__ import annotations

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
