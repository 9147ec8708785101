"""The host twins of the sketch's per-block products (numpy): ``arrays`` on host slabs.

A block is copied into float64 ``SLAB_BYTES`` at a time (measured here on 128^2 float32
patterns, one thread: 0.44 GB/s of block read at 1 MiB slabs, 0.80 at 4 MiB, 0.91 at 8 MiB,
0.88 at 16 MiB), so a product's scratch stays one slab however large the block is.
"""

from __future__ import annotations

from typing import Any

from outcore.sketch.kernels import arrays

Array = Any

#: Bytes of one float64 slab of rows on the host (a product's scratch besides its panels).
SLAB_BYTES = 8 * 2**20


def normal_product(a: Array, v: Array, mean: Array | None = None,
                   offset: Array | None = None) -> Array:
    """``A_c^T (A_c V)`` of an ``(r, m)`` block in one sweep, ``(m, l)`` float64."""
    return arrays.normal_product(a, v, mean, offset, SLAB_BYTES)


def first_pass(a: Array, v: Array) -> tuple[Array, Array]:
    """``A^T (A V)`` and the column sums of an ``(r, m)`` block."""
    return arrays.first_pass(a, v, SLAB_BYTES)


def final_pass(a: Array, v: Array, mean: Array, offset: Array | None = None
               ) -> tuple[Array, Array]:
    """``(A - 1 mean^T) V`` and the squared deviations from ``mean`` of an ``(r, m)`` block,
    float64."""
    return arrays.final_pass(a, v, mean, offset, SLAB_BYTES)


def expand(x: Array, f: Array, mean: Array | None = None, dtype: Any = "float32") -> Array:
    """``X F + 1 mean^T`` as an ``(r, m)`` array of ``dtype``."""
    return arrays.expand(x, f, mean, dtype, SLAB_BYTES)
