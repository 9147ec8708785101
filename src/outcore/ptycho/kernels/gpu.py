"""Device twins of ``outcore.ptycho.kernels`` (cupy; each has a host twin of the same name
in ``cpu.py``, and a ``gpu``-marked test in ``tests/test_ptycho_kernels.py`` comparing the
two): windows by fancy indexing, overlaps summed with ``cupyx.scatter_add``, the fused
operations as the array code of ``arrays.py``, ``cupyx.scipy.fft``, pinned host memory. The
only module of ``outcore.ptycho`` that imports cupy, on first use, so it imports on machines
without it."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from outcore import backend
from outcore.ptycho.kernels import arrays

Array = Any


def _index(top_left: np.ndarray, k: int) -> tuple[Array, Array]:
    """Index arrays ``(rows (n, k, 1), cols (n, 1, k))`` on the device that cut each window."""
    import cupy

    offsets = cupy.arange(k)
    rows = cupy.asarray(top_left[:, 0])[:, None] + offsets[None, :]
    cols = cupy.asarray(top_left[:, 1])[:, None] + offsets[None, :]
    return rows[:, :, None], cols[:, None, :]


def fft() -> ModuleType:
    """``cupyx.scipy.fft``."""
    import cupy

    return backend.fft(cupy)


def windows(image: Array, top_left: np.ndarray, k: int) -> Array:
    rows, cols = _index(top_left, k)
    return image[rows, cols]


def scatter_add(target: Array, top_left: np.ndarray, values: Array) -> None:
    import cupy
    import cupyx

    values = cupy.broadcast_to(values, (len(top_left), *values.shape[1:]))
    rows, cols = (cupy.broadcast_to(i, values.shape) for i in _index(top_left, values.shape[-1]))
    if cupy.iscomplexobj(values):
        cupyx.scatter_add(target.real, (rows, cols), values.real)
        cupyx.scatter_add(target.imag, (rows, cols), values.imag)
    else:
        cupyx.scatter_add(target, (rows, cols), values)


def exit_waves(layer: Array, top_left: np.ndarray, waves: Array) -> Array:
    return arrays.exit_waves(layer, top_left, waves, windows)


residual = arrays.residual
curvature = arrays.curvature
unshift = arrays.unshift
object_step = arrays.object_step


def back_layer(chi: Array, layer: Array, top_left: np.ndarray, incident: Array, grad: Array,
               local: np.ndarray, illum: Array | None, probe_sum: Array | None) -> None:
    arrays.back_layer(chi, layer, top_left, incident, grad, local, illum, probe_sum, windows,
                      scatter_add)


def staged(host: np.ndarray) -> np.ndarray:
    """A copy of ``host`` in page-locked memory, so device copies run at full speed."""
    import cupyx

    out = cupyx.empty_pinned(host.shape, host.dtype)
    out[...] = host
    return out
