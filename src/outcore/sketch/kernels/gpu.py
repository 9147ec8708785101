"""The device twins of the sketch's per-block products (cupy): ``arrays`` on the GPU.

The block is a cupy array; the panels, the mean and the offset may come from the host and
are moved to the device first (float64). Slabs are larger than on the host (``SLAB_BYTES``):
a GPU's matrix products want tall operands. cupy is imported inside the functions, so this
module imports without it.
"""

from __future__ import annotations

from typing import Any

from outcore.sketch.kernels import arrays

Array = Any

#: Bytes of one float64 slab of rows on the device.
SLAB_BYTES = 256 * 2**20


def _device(x: Array | None) -> Array | None:
    import cupy

    return None if x is None else cupy.asarray(x, dtype=cupy.float64)


def normal_product(a: Array, v: Array, mean: Array | None = None,
                   offset: Array | None = None, float64: bool = False) -> Array:
    """``A_c^T (A_c V)`` of an ``(r, m)`` cupy block, ``(m, l)`` float64 on the device."""
    return arrays.normal_product(a, _device(v), _device(mean), _device(offset), SLAB_BYTES,
                                 float64)


def first_pass(a: Array, v: Array, float64: bool = False) -> tuple[Array, Array]:
    """``A^T (A V)`` and the column sums of an ``(r, m)`` cupy block, on the device."""
    return arrays.first_pass(a, _device(v), SLAB_BYTES, float64)


def final_pass(a: Array, v: Array, mean: Array, offset: Array | None = None
               ) -> tuple[Array, Array]:
    """``(A - 1 mean^T) V`` and the squared deviations from ``mean`` of an ``(r, m)`` cupy
    block, float64 on the device."""
    return arrays.final_pass(a, _device(v), _device(mean), _device(offset), SLAB_BYTES)


def expand(x: Array, f: Array, mean: Array | None = None, dtype: Any = "float32") -> Array:
    """``X F + 1 mean^T`` as an ``(r, m)`` cupy array of ``dtype``."""
    return arrays.expand(_device(x), _device(f), _device(mean), dtype, SLAB_BYTES)
