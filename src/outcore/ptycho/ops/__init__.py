"""The array operations of ``outcore.ptycho`` that differ between numpy and cupy, behind one
dispatch: each function looks at the array it gets and runs ``ops.cpu`` (numpy, scipy.fft)
or ``ops.gpu`` (cupy, cupyx), so the kernels and the engine are written once.

- ``fft(x)``: the FFT module for ``x`` (``scipy.fft`` on the host, ``cupyx.scipy.fft`` on a
  GPU), with ``fft2`` / ``ifft2`` taking ``norm`` and ``overwrite_x``.
- ``windows(image, top_left, k)``: the ``k x k`` windows of a 2-D array at the integer
  corners ``top_left (n, 2)`` (row, col), stacked ``(n, k, k)``.
- ``scatter_add(target, top_left, values)``: ``target[window j] += values[j]`` in place,
  overlaps summed.
- ``staged(host, backend)``: a host copy of ``host`` from which the backend's device copies
  are fast (page-locked memory for cupy, the array itself for numpy).

Every GPU function has its numpy twin in ``cpu.py``; ``tests/test_ptycho_kernels.py``
compares them (``gpu``-marked, skipped without a GPU).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from outcore.backend import array_namespace
from outcore.ptycho.ops import cpu

Array = Any


def _impl(x: Array) -> ModuleType:
    if array_namespace(x) is np:
        return cpu
    from outcore.ptycho.ops import gpu  # pragma: no cover - needs a GPU

    return gpu  # pragma: no cover


def fft(x: Array) -> ModuleType:
    """The FFT module for arrays like ``x``."""
    return _impl(x).fft()


def windows(image: Array, top_left: np.ndarray, k: int) -> Array:
    """The ``k x k`` windows of ``image`` (Ny, Nx) at ``top_left`` (n, 2): (n, k, k)."""
    return _impl(image).windows(image, np.asarray(top_left), k)


def scatter_add(target: Array, top_left: np.ndarray, values: Array) -> None:
    """``target[window j] += values[j]`` for every window ``j``, in place."""
    _impl(target).scatter_add(target, np.asarray(top_left), values)


def staged(host: np.ndarray, backend: str) -> np.ndarray:
    """``host`` where copies to ``backend``'s device are fast (pinned memory for cupy)."""
    if backend == "cupy":  # pragma: no cover - needs a GPU
        from outcore.ptycho.ops import gpu

        return gpu.pinned(host)
    return host
