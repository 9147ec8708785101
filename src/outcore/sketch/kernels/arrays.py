"""The sketch's per-block products, written once against the block's array namespace.

A block ``a`` is an ``(r, m)`` matrix: ``r`` items of ``m`` pixels in the store's dtype
(float32, float64 or unsigned counts). Every product is computed in float64: the block is
copied into one float64 buffer of ``slab_rows`` rows at a time, each slab used by both
products of a fused step while it is in cache, so a float32 block never has a whole float64
copy. Within a block the slabs are added in row order: a block gives the same sums wherever
it runs. Centring (``mean``, the ``(m,)`` mean pattern, and ``offset = V^T mean``) is folded
into the products as the rank-one correction of ``A - 1 mean^T``: no centred copy is made.

The panels (``v``: ``(m, l)``, ``x``: ``(r, k)``, ``f``: ``(k, m)``) are float64 arrays of
the block's namespace. Products over the pixels are accumulated transposed, ``(l, m)``, where
the matrix product of a slab is fastest, and returned as ``(m, l)`` views.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from outcore.backend import array_namespace

Array = Any


def slab_rows(pixels: int, slab_bytes: int) -> int:
    """Rows of ``pixels`` float64 values that fill ``slab_bytes`` (at least 1)."""
    return max(1, slab_bytes // (8 * max(1, pixels)))


def _slabs(a: Array, slab_bytes: int) -> Iterator[tuple[slice, Array]]:
    """The rows of ``a`` in slabs: each slab's rows and a float64 copy of them (one buffer,
    refilled slab after slab, so the caller may change it)."""
    xp = array_namespace(a)
    step = min(a.shape[0], slab_rows(a.shape[1], slab_bytes))
    buffer = xp.empty((step, a.shape[1]), dtype=xp.float64)
    for start in range(0, a.shape[0], step):
        rows = slice(start, min(start + step, a.shape[0]))
        slab = buffer[:rows.stop - start]
        xp.copyto(slab, a[rows], casting="unsafe")
        yield rows, slab


def project(a: Array, v: Array, offset: Array | None, slab_bytes: int) -> Array:
    """``A V``, ``(r, l)`` float64, for ``v`` ``(m, l)``; with ``offset`` (``V^T mean``,
    ``(l,)``) subtracted from every row: ``(A - 1 mean^T) V``."""
    xp = array_namespace(a)
    out = xp.empty((a.shape[0], v.shape[1]), dtype=xp.float64)
    for rows, slab in _slabs(a, slab_bytes):
        xp.matmul(slab, v, out=out[rows])
    if offset is not None:
        out -= offset
    return out


def normal_product(a: Array, v: Array, mean: Array | None, offset: Array | None,
                   slab_bytes: int) -> Array:
    """``A^T (A V)``, ``(m, l)`` float64, in one sweep of the block; with ``mean`` and
    ``offset = V^T mean`` that of the centred block, ``A_c^T (A_c V)`` with
    ``A_c = A - 1 mean^T``: ``A^T X - mean (1^T X)`` for ``X = A V - 1 offset^T``."""
    xp = array_namespace(a)
    acc = xp.zeros((v.shape[1], a.shape[1]), dtype=xp.float64)
    column = xp.zeros(v.shape[1], dtype=xp.float64)
    for _, slab in _slabs(a, slab_bytes):
        x = slab @ v
        if offset is not None:
            x -= offset
            column += x.sum(axis=0)
        acc += x.T @ slab
    if mean is not None:
        acc -= xp.outer(column, mean)
    return acc.T


def first_pass(a: Array, v: Array, slab_bytes: int) -> tuple[Array, Array, Array]:
    """The first read of a block: ``A^T (A V)`` (``(m, l)``), the column sums ``A^T 1``
    (``(m,)``) and the sum of squared deviations of every value from its column's mean in
    the block (a 0-d array), all float64. The deviations of each slab are taken from the
    slab's own mean and joined slab by slab (Chan, Golub and LeVeque's update), so a large
    mean costs no precision."""
    xp = array_namespace(a)
    acc = xp.zeros((v.shape[1], a.shape[1]), dtype=xp.float64)
    sums = xp.zeros(a.shape[1], dtype=xp.float64)
    squares = xp.zeros((), dtype=xp.float64)
    count = 0
    for rows, slab in _slabs(a, slab_bytes):
        acc += (slab @ v).T @ slab
        n = rows.stop - rows.start
        part = slab.sum(axis=0)
        if count:
            gap = sums / count - part / n
            squares += (gap @ gap) * (count * n / (count + n))
        sums += part
        count += n
        slab -= part / n
        squares += xp.vdot(slab.ravel(), slab.ravel())
    return acc.T, sums, squares


def expand(x: Array, f: Array, mean: Array | None, dtype: Any, slab_bytes: int) -> Array:
    """``X F`` (plus ``mean`` on every row when given) as an ``(r, m)`` array of ``dtype``,
    for ``x`` ``(r, k)`` and ``f`` ``(k, m)``: one block of a rank-``k`` stack, computed in
    float64 a slab of rows at a time and cast into the output."""
    xp = array_namespace(x)
    out = xp.empty((x.shape[0], f.shape[1]), dtype=dtype)
    step = slab_rows(f.shape[1], slab_bytes)
    for start in range(0, x.shape[0], step):
        rows = slice(start, min(start + step, x.shape[0]))
        slab = x[rows] @ f
        if mean is not None:
            slab += mean
        out[rows] = slab
    return out
