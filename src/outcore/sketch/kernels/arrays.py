"""The sketch's per-block products, written once against the block's array namespace.

A block ``a`` is an ``(r, m)`` matrix: ``r`` items of ``m`` pixels in the store's dtype
(float32, float64 or unsigned counts), taken ``slab_rows`` rows at a time.

Two precisions, each where it serves:

- the passes that only search the subspace (``first_pass``, ``normal_product``) multiply in
  ``search_dtype(a.dtype)``: float32 for float32 blocks and for counts of 8 or 16 bits (which
  float32 holds exactly), float64 otherwise. In float32 a block is multiplied about its own
  column mean, with the mean's terms added in float64 (``_about_own_mean``), so float32
  rounds the deviations, not the values; each slab's ``(l, m)`` product is added into a
  float64 term, and the terms into the float64 sum across blocks. The rounding of float32
  reaches only the search: the power scheme converges to the same subspace (a perturbation
  of the panel is another start), and the singular values of the last pass's float64
  Rayleigh-Ritz step move by its square. The search's last pass is in float64
  (``float64=True``): one power step in float64 shrinks float32's perturbation of the
  subspace by ``(sigma_{l+1} / sigma_j)^2``, so the factors too agree with float64's, on
  any chunking, to 1e-6 of their largest entry. A float32 term that overflows (values beyond
  about 1e18) is computed again in float64;
- the last pass (``final_pass``), whose product gives the singular values and factors, and
  every sum that is reported (column sums, squared deviations), are in float64: the block
  is copied into one float64 slab at a time, so a float32 block never has a whole float64
  copy.

Within a block the slabs are added in row order: a block gives the same sums wherever it
runs. Centring (``mean``, the ``(m,)`` mean pattern, and ``offset = V^T mean``) is folded
into the products as the rank-one correction of ``A - 1 mean^T``: no centred copy is made.

The panels (``v``: ``(m, l)``, ``x``: ``(r, k)``, ``f``: ``(k, m)``) are float64 arrays of
the block's namespace. Products over the pixels are accumulated transposed, ``(l, m)``, where
the matrix product of a slab is fastest, and returned as ``(m, l)`` views.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from outcore.backend import array_namespace

Array = Any


def search_dtype(dtype: Any) -> np.dtype:
    """The dtype the subspace search multiplies a block of ``dtype`` in: float32 for float32,
    float16 and integers of 8 or 16 bits (float32 holds them exactly), else float64."""
    dtype = np.dtype(dtype)
    exact_in_float32 = (dtype.kind == "f" and dtype.itemsize <= 4
                        or dtype.kind in "biu" and dtype.itemsize <= 2)
    return np.dtype(np.float32 if exact_in_float32 else np.float64)


def slab_rows(pixels: int, slab_bytes: int, itemsize: int = 8) -> int:
    """Rows of ``pixels`` values of ``itemsize`` bytes that fill ``slab_bytes`` (at least 1)."""
    return max(1, slab_bytes // (itemsize * max(1, pixels)))


def _slabs(a: Array, slab_bytes: int, dtype: Any = np.float64, copy: bool = True
           ) -> Iterator[tuple[slice, Array]]:
    """The rows of ``a`` in slabs of ``dtype``: each slab's rows and the slab, a copy into
    one buffer refilled slab after slab (which the caller may change), or with
    ``copy=False`` a view of ``a`` where it has that dtype already (not to be changed)."""
    xp = array_namespace(a)
    dtype = np.dtype(dtype)
    step = min(a.shape[0], slab_rows(a.shape[1], slab_bytes, dtype.itemsize))
    buffer = (None if a.dtype == dtype and not copy
              else xp.empty((step, a.shape[1]), dtype=dtype))
    for start in range(0, a.shape[0], step):
        rows = slice(start, min(start + step, a.shape[0]))
        if buffer is None:
            yield rows, a[rows]
            continue
        slab = buffer[:rows.stop - start]
        xp.copyto(slab, a[rows], casting="unsafe")
        yield rows, slab


def _normal_in(a: Array, v: Array, mean: Array | None, offset: Array | None,
               slab_bytes: int, dtype: np.dtype, sums: Array | None = None) -> Array:
    """``A_c^T (A_c V)`` as ``(l, m)`` float64, the slabs multiplied in ``dtype``; the column
    sums added into ``sums`` (float64) when given. In float32 the slabs are taken about the
    block's own column mean (``_about_own_mean``)."""
    xp = array_namespace(a)
    if dtype != np.float64:
        return _about_own_mean(a, v, mean, slab_bytes, sums)
    acc = xp.zeros((v.shape[1], a.shape[1]), dtype=xp.float64)
    column = xp.zeros(v.shape[1], dtype=xp.float64)
    for _, slab in _slabs(a, slab_bytes, dtype, copy=False):
        if sums is not None:
            sums += xp.sum(slab, axis=0, dtype=xp.float64)
        x = slab @ v
        if offset is not None:
            x = x - offset
            column += x.sum(axis=0)
        acc += x.T @ slab
    if mean is not None:
        acc -= xp.outer(column, mean)
    return acc


def _about_own_mean(a: Array, v: Array, mean: Array | None, slab_bytes: int,
                    sums: Array | None) -> Array:
    """``A_c^T (A_c V)`` as ``(l, m)`` float64, multiplied in float32 about the block's own
    column mean ``c`` (rounded to float32): with ``S = A - 1 c^T`` and ``d = c - mean`` (``c``
    uncentred), ``A_c = S + 1 d^T`` and ``A_c^T A_c V = S^T X + s t^T + d (1^T X)^T + r d t^T``
    for ``X = S V``, ``s = S^T 1``, ``t = V^T d``. Only ``S^T X`` is a float32 product, so
    its rounding is float32's of the block's deviations, not of its values: a bright
    background (counts of 1000 varying by 10) costs no precision. The rank-one terms are
    float64."""
    xp = array_namespace(a)
    rows = a.shape[0]
    own = xp.sum(a, axis=0, dtype=xp.float64)
    if sums is not None:
        sums += own
    c32 = (own / rows).astype(xp.float32)
    c = c32.astype(xp.float64)
    d = c if mean is None else c - mean
    panel = v.astype(xp.float32)
    acc = xp.zeros((v.shape[1], a.shape[1]), dtype=xp.float64)
    column = xp.zeros(v.shape[1], dtype=xp.float64)
    step = min(rows, slab_rows(a.shape[1], slab_bytes))  # half the float64 slab's bytes
    buffer = xp.empty((step, a.shape[1]), dtype=xp.float32)
    for start in range(0, rows, step):
        slab = buffer[:min(step, rows - start)]
        xp.subtract(a[start:start + slab.shape[0]], c32, out=slab, casting="unsafe")
        x = slab @ panel
        column += xp.sum(x, axis=0, dtype=xp.float64)
        acc += x.T @ slab
    t = v.T @ d
    acc += xp.outer(t, own - rows * c + rows * d)  # s t^T + r d t^T, transposed
    acc += xp.outer(column, d)
    return acc


def _searched(a: Array, v: Array, mean: Array | None, offset: Array | None,
              slab_bytes: int, sums: Array | None = None, float64: bool = False) -> Array:
    """``_normal_in`` in ``search_dtype`` (float64 with ``float64``), again in float64 where
    float32 overflowed (the sums, when asked, then added again from zero)."""
    xp = array_namespace(a)
    dtype = np.dtype(np.float64) if float64 else search_dtype(a.dtype)
    with np.errstate(over="ignore", invalid="ignore"):  # float32's overflow, met below
        acc = _normal_in(a, v, mean, offset, slab_bytes, dtype, sums)
    if dtype != np.float64 and not bool(xp.isfinite(acc).all()):
        if sums is not None:
            sums[...] = 0
        acc = _normal_in(a, v, mean, offset, slab_bytes, np.dtype(np.float64), sums)
    return acc


def normal_product(a: Array, v: Array, mean: Array | None, offset: Array | None,
                   slab_bytes: int, float64: bool = False) -> Array:
    """``A^T (A V)``, ``(m, l)`` float64, in one sweep of the block, multiplied in
    ``search_dtype`` (in float64 with ``float64``: the search's last pass); with ``mean``
    and ``offset = V^T mean`` that of the centred block, ``A_c^T (A_c V)`` with
    ``A_c = A - 1 mean^T``: in float64 ``A^T X - mean (1^T X)`` for
    ``X = A V - 1 offset^T``."""
    return _searched(a, v, mean, offset, slab_bytes, None, float64).T


def first_pass(a: Array, v: Array, slab_bytes: int, float64: bool = False
               ) -> tuple[Array, Array]:
    """The first read of a block: ``A^T (A V)`` (``(m, l)``, multiplied in ``search_dtype``,
    or float64 with ``float64``) and the column sums ``A^T 1`` (``(m,)``, added in
    float64)."""
    xp = array_namespace(a)
    sums = xp.zeros(a.shape[1], dtype=xp.float64)
    return _searched(a, v, None, None, slab_bytes, sums, float64).T, sums


def final_pass(a: Array, v: Array, mean: Array, offset: Array | None,
               slab_bytes: int) -> tuple[Array, Array]:
    """The last read of a block, in float64: ``A V`` (``(r, l)``; with ``offset = V^T mean``
    subtracted from every row, ``(A - 1 mean^T) V``) and the squared deviations of every
    value from ``mean``, the stack's mean pattern (a 0-d array): deviations from the mean
    itself, so a large mean costs no precision."""
    xp = array_namespace(a)
    out = xp.empty((a.shape[0], v.shape[1]), dtype=xp.float64)
    squares = xp.zeros((), dtype=xp.float64)
    for rows, slab in _slabs(a, slab_bytes):
        xp.matmul(slab, v, out=out[rows])
        slab -= mean
        squares += xp.vdot(slab.ravel(), slab.ravel())
    if offset is not None:
        out -= offset
    return out, squares


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
