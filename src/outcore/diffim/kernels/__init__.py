"""Difference imaging's kernels: ZOGY on one window of a tile, on the host or a GPU.

``subtract`` gives ``D``, ``V_D``, ``S`` and ``S_corr`` of a host window on the backend the
run resolved (``backend.kernels_named``): ``cpu.py`` runs the array code where the window
is, ``gpu.py`` copies it to the device, runs it there and copies the results back. The
array code is ``arrays.py``'s (``apply`` on numpy or cupy windows, ``kernel_hat`` the kernels'
spectra), written once: numpy and cupy differ only in their FFT module (``backend.fft``) and
in where the window lies. ``tests/test_diffim_kernels.py`` compares the twins. Reading,
background, detection and measurement are host code (``tile``, ``background``, ``detect``,
``measure``).
"""

from __future__ import annotations

import numpy as np

from outcore.backend import kernels_named, resolve
from outcore.diffim.zogy import ZogyKernels


def subtract(reference: np.ndarray, target: np.ndarray, var_r: np.ndarray, var_n: np.ndarray,
             kernels: ZogyKernels, backend: str) -> dict[str, np.ndarray]:
    """``D``, ``V_D``, ``S`` and ``S_corr`` (float64, on the host) of a window, computed on
    ``backend`` (``numpy``, ``cupy`` or ``auto``; ``backend.resolve`` refuses cupy without a
    GPU).

    The inputs are background-subtracted ``(ly, lx)`` host windows of the reference and the
    target and their variances, zero (value and variance) where a pixel is bad or outside
    the image; the outputs are ``(ly - 2 H, lx - 2 H)`` (``arrays.apply``)."""
    twin = kernels_named(resolve(backend), __name__)
    return twin.subtract(reference, target, var_r, var_n, kernels)
