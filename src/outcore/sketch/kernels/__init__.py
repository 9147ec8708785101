"""The sketch's per-block products, on numpy or cupy blocks.

Each function takes one block of the stack as an ``(r, m)`` matrix (``r`` items of ``m``
pixels, in the store's dtype) and dispatches on it (``backend.kernels``): numpy blocks run
``cpu.py``, cupy blocks ``gpu.py``; both run the array code of ``arrays.py`` one slab of rows
at a time, the subspace search in float32 where the block's values are exact in it and the
last pass in float64 (``arrays``' docstring says why). The panels (``v`` ``(m, l)``, ``x``
``(r, k)``, ``f`` ``(k, m)``) are float64; ``mean`` is the ``(m,)`` mean pattern and
``offset`` its product ``V^T mean`` (``(l,)``), which centre the block (``A - 1 mean^T``)
without a centred copy.
``tests/test_sketch_kernels.py`` checks the host twins against numpy and the device twins
against the host.
"""

from __future__ import annotations

from typing import Any

from outcore.backend import kernels

Array = Any


def normal_product(a: Array, v: Array, mean: Array | None = None,
                   offset: Array | None = None, float64: bool = False) -> Array:
    """``A_c^T (A_c V)`` in one read of the block, ``(m, l)`` float64 (``A_c = A - 1 mean^T``
    when ``mean`` and ``offset = V^T mean`` are given, else ``A``), multiplied in
    ``arrays.search_dtype`` (float64 with ``float64``, the search's last pass): one block's
    term of a power iteration."""
    return kernels(a, __name__).normal_product(a, v, mean, offset, float64)


def first_pass(a: Array, v: Array, float64: bool = False) -> tuple[Array, Array]:
    """The first read's terms of a block: ``A^T (A V)`` ``(m, l)`` (multiplied in
    ``arrays.search_dtype``, float64 with ``float64``) and the column sums ``A^T 1``
    ``(m,)``, float64."""
    return kernels(a, __name__).first_pass(a, v, float64)


def final_pass(a: Array, v: Array, mean: Array, offset: Array | None = None
               ) -> tuple[Array, Array]:
    """The last read's terms of a block, in float64: ``(A - 1 mean^T) V`` ``(r, l)``
    (``A V`` without ``offset = V^T mean``) and the squared deviations of its values from
    the stack's mean pattern ``mean`` (0-d)."""
    return kernels(a, __name__).final_pass(a, v, mean, offset)


def expand(x: Array, f: Array, mean: Array | None = None, dtype: Any = "float32") -> Array:
    """``X F + 1 mean^T`` as an ``(r, m)`` array of ``dtype``: a block of a rank-``k`` stack
    from its ``(r, k)`` left factors (scaled by the singular values) and ``(k, m)`` right
    factors. Dispatches on ``x``."""
    return kernels(x, __name__).expand(x, f, mean, dtype)
