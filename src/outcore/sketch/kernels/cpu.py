"""The host twins of the sketch's per-block products (numpy): ``arrays`` on host slabs, on
one BLAS thread.

A block is copied into float64 ``SLAB_BYTES`` at a time where it is copied (measured here on
128^2 float32 patterns, one thread: 0.44 GB/s of block read at 1 MiB slabs, 0.80 at 4 MiB,
0.91 at 8 MiB, 0.88 at 16 MiB), so a product's scratch stays one slab however large the
block is.

Dask runs one task per worker thread: the cores are shared out by the tasks, and a matrix
product that starts its own BLAS threads as well oversubscribes them (worker processes get
one BLAS thread from distributed; workers that are threads of one process share its BLAS
pool, and on 2 cores the sketch of a 1.2 GB stack took 29 CPU seconds with it against 10
with one BLAS thread). So every product runs under ``one_blas_thread``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from threadpoolctl import ThreadpoolController

from outcore.sketch.kernels import arrays

Array = Any

#: Bytes of one float64 slab of rows on the host (a product's scratch besides its panels).
SLAB_BYTES = 8 * 2**20

_BLAS = threading.Lock()
_blas_users = 0
_blas_limit: Any = None


@contextlib.contextmanager
def one_blas_thread() -> Iterator[None]:
    """BLAS on one thread while any product of this process runs (threadpoolctl; the limit
    is process-wide, so it is set by the first product that enters and lifted by the last
    that leaves)."""
    global _blas_users, _blas_limit
    with _BLAS:
        if _blas_users == 0:
            _blas_limit = ThreadpoolController().limit(limits=1, user_api="blas")
        _blas_users += 1
    try:
        yield
    finally:
        with _BLAS:
            _blas_users -= 1
            if _blas_users == 0:
                _blas_limit.restore_original_limits()
                _blas_limit = None


def normal_product(a: Array, v: Array, mean: Array | None = None,
                   offset: Array | None = None, float64: bool = False) -> Array:
    """``A_c^T (A_c V)`` of an ``(r, m)`` block in one sweep, ``(m, l)`` float64."""
    with one_blas_thread():
        return arrays.normal_product(a, v, mean, offset, SLAB_BYTES, float64)


def first_pass(a: Array, v: Array, float64: bool = False) -> tuple[Array, Array]:
    """``A^T (A V)`` and the column sums of an ``(r, m)`` block."""
    with one_blas_thread():
        return arrays.first_pass(a, v, SLAB_BYTES, float64)


def final_pass(a: Array, v: Array, mean: Array, offset: Array | None = None
               ) -> tuple[Array, Array]:
    """``(A - 1 mean^T) V`` and the squared deviations from ``mean`` of an ``(r, m)`` block,
    float64."""
    with one_blas_thread():
        return arrays.final_pass(a, v, mean, offset, SLAB_BYTES)


def expand(x: Array, f: Array, mean: Array | None = None, dtype: Any = "float32") -> Array:
    """``X F + 1 mean^T`` as an ``(r, m)`` array of ``dtype``."""
    with one_blas_thread():
        return arrays.expand(x, f, mean, dtype, SLAB_BYTES)
