"""The randomized SVD of a stack: Halko, Martinsson and Tropp's range finder in its row-space
form, over a stack read block by block.

``svd(ds, rank)`` sees ``ds[var]`` as the matrix ``A`` of items by pixels
(``outcore.sketch.stack``) and reads it ``power_iterations + 2`` times:

1. ``V_0 = orth(Omega)``, the seed's one Gaussian test matrix (``draws``). The first read
   adds up ``A^T (A V_0)`` over the blocks, with the column sums and the squared deviations
   (so the mean pattern and the sum of squares come with it);
2. each later power read adds up ``A^T (A V_{k-1})`` (centred with ``center``: the mean is
   known after the first read, and the first read's term is corrected by the rank-one term
   ``n mean (V_0^T mean)^T``), and ``V_k`` is its QR factor ``Q``;
3. the last read computes ``B = A V`` block by block, gathered to the client (an
   ``(items, l)`` panel), and the R factors of the blocks' QR, reduced by QR in a fixed
   tree; the SVD of the small ``R = U_R S W^T`` gives the singular values ``S``, the right
   factors ``V W`` and the left factors ``B W S^-1`` (``= Q U_R``).

Every block's term is computed in float64 (``kernels``) and the terms are added in a fixed
tree over the blocks in index order, so the factors do not depend on the workers; another
chunking changes only the rounding. Each component's sign makes its right factor's largest
entry positive (the first, in pixel order, of the entries within ``SIGN_TOLERANCE`` of the
largest), so rounding cannot flip it. The bounds the result meets are in
docs/operators/sketch.md.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import dask
import dask.array as da
import distributed
import numpy as np
import xarray as xr
from dask.delayed import Delayed

from outcore import backend as backends
from outcore import progress
from outcore.errors import LayoutError
from outcore.io.layouts import LAYOUT_ATTR
from outcore.sketch import kernels
from outcore.sketch.draws import omega
from outcore.sketch.memory import FAN_IN, denoised_dtype
from outcore.sketch.stack import Stack, check_options, describe

#: Entries of a right factor within this fraction of its largest magnitude count as tied
#: for the sign convention; the first of them in pixel order is made positive.
SIGN_TOLERANCE = 1e-6
#: Singular values below this fraction of the largest (times the larger side) are taken as
#: zero: their left factors are zero rather than noise divided by almost nothing.
NEGLIGIBLE = 1e-12


# --- the tasks: plain functions of one block -----------------------------------------------


def _matrix(block: np.ndarray, split: int, backend: str) -> Any:
    """A block of whole patterns (``split`` item dims first) as an ``(r, m)`` matrix on the
    backend (a view on the host)."""
    rows = math.prod(block.shape[:split])
    return backends.to_backend(np.ascontiguousarray(block).reshape(rows, -1), backend)


def _first_term(block: np.ndarray, v: np.ndarray, split: int, backend: str
                ) -> tuple[np.ndarray, np.ndarray, int, float]:
    """The first read's term of a block: ``A^T (A V)``, column sums, rows, squared
    deviations from the block's column means."""
    a = _matrix(block, split, backend)
    w, sums, squares = kernels.first_pass(a, v)
    return (backends.to_host(w), backends.to_host(sums), a.shape[0],
            float(backends.to_host(squares)))


def _join_moments(*terms: tuple[np.ndarray, np.ndarray, int, float]
                  ) -> tuple[np.ndarray, np.ndarray, int, float]:
    """First-read terms added left to right; the squared deviations joined by Chan, Golub
    and LeVeque's update (each part's deviations are from its own mean)."""
    w, sums, count, squares = terms[0]
    w, sums = w.copy(), sums.copy()
    for w_b, sums_b, count_b, squares_b in terms[1:]:
        gap = sums / count - sums_b / count_b
        squares = squares + squares_b + float(gap @ gap) * count * count_b / (count + count_b)
        w += w_b
        sums += sums_b
        count += count_b
    return w, sums, count, squares


def _term(block: np.ndarray, v: np.ndarray, mean: np.ndarray | None, split: int,
          backend: str) -> np.ndarray:
    """A power read's term of a block: ``A_c^T (A_c V)``."""
    offset = None if mean is None else mean @ v
    return backends.to_host(kernels.normal_product(_matrix(block, split, backend), v, mean,
                                                   offset))


def _add(*terms: np.ndarray) -> np.ndarray:
    """``terms`` added left to right."""
    total = terms[0].copy()
    for term in terms[1:]:
        total += term
    return total


def _project(block: np.ndarray, v: np.ndarray, mean: np.ndarray | None, split: int,
             backend: str) -> np.ndarray:
    """The last read's panel of a block: ``A_c V``, ``(r, l)``."""
    offset = None if mean is None else mean @ v
    return backends.to_host(kernels.project(_matrix(block, split, backend), v, offset))


def _r_factor(b: np.ndarray) -> np.ndarray:
    return np.linalg.qr(b, mode="r")


def _stacked_r(*factors: np.ndarray) -> np.ndarray:
    return np.linalg.qr(np.concatenate(factors, axis=0), mode="r")


def _expand(u: np.ndarray, f: np.ndarray, mean: np.ndarray | None, dtype: np.dtype,
            pixel_shape: tuple[int, ...], backend: str) -> np.ndarray:
    """A block of the rank-``k`` stack from its ``(items..., k)`` scaled left factors."""
    rows = u.shape[:-1]
    x = backends.to_backend(np.ascontiguousarray(u).reshape(-1, u.shape[-1]), backend)
    return backends.to_host(kernels.expand(x, f, mean, dtype)).reshape(*rows, *pixel_shape)


# --- the graph --------------------------------------------------------------------------------


def _tree(parts: Sequence[Delayed], combine: Callable[..., Any]) -> Delayed:
    """``parts`` reduced by ``combine`` in a fixed tree: ``FAN_IN`` neighbours at a time in
    index order, level by level, the same tree on any cluster."""
    level = list(parts)
    while len(level) > 1:
        level = [dask.delayed(combine, pure=True)(*level[i:i + FAN_IN])
                 for i in range(0, len(level), FAN_IN)]
    return level[0]


def _client(client: distributed.Client | None) -> distributed.Client | None:
    if client is not None:
        return client
    try:
        return distributed.default_client()
    except ValueError:
        return None


def _compute(client: distributed.Client | None, *objs: Any) -> list[Any]:
    if client is None:
        return list(dask.compute(*objs))
    return progress.compute(client, *objs)


def _orth(w: np.ndarray) -> np.ndarray:
    return np.linalg.qr(w)[0]


def signs(v: np.ndarray) -> np.ndarray:
    """+1 or -1 per column of ``v`` that makes its largest-magnitude entry positive (the
    first entry, in order, within ``SIGN_TOLERANCE`` of the largest)."""
    size = np.abs(v)
    first = np.argmax(size >= (1 - SIGN_TOLERANCE) * size.max(axis=0), axis=0)
    found = np.sign(v[first, np.arange(v.shape[1])])
    return np.where(found == 0, 1.0, found)


def stack_array(data: xr.DataArray, stack: Stack,
                chunks: Mapping[str, int] | None = None) -> da.Array:
    """``data`` as a dask array of whole patterns, chunked along the items as ``chunks``
    says (item dim -> items; item dims left out keep their chunks), each pixel dim in one
    chunk. ValueError when ``chunks`` names a dim that is not an item dim."""
    unknown = set(chunks or {}) - set(stack.item_dims)
    if unknown:
        raise ValueError(f"chunks names {sorted(unknown)}, not among the item dims"
                         f" {list(stack.item_dims)}")
    array = data.data if isinstance(data.data, da.Array) else da.from_array(
        np.asarray(data.data), chunks=stack.store_chunks)
    current = {d: max(c) for d, c in zip(data.dims, array.chunks, strict=True)}
    wanted = {**current, **dict(chunks or {}),
              **dict(zip(stack.pixel_dims, stack.pixel_shape, strict=True))}
    if any(len(c) > 1 and d in stack.pixel_dims or current[d] != wanted[d]
           for d, c in zip(data.dims, array.chunks, strict=True)):
        array = array.rechunk(tuple(wanted[d] for d in data.dims))
    return array


def svd(ds: xr.Dataset, rank: int, *, var: str | None = None, oversample: int = 10,
        power_iterations: int = 2, seed: int = 0, center: bool = False,
        client: distributed.Client | None = None, backend: str = "numpy",
        chunks: Mapping[str, int] | None = None, hold: bool = False) -> xr.Dataset:
    """The ``rank`` leading singular triplets of ``ds[var]`` (items by pixels, see
    ``outcore.sketch.stack``) from a randomized sketch of width ``l = rank + oversample``
    with ``power_iterations`` power reads: ``power_iterations + 2`` reads of the stack.

    ``var`` defaults to the main variable of the dataset's layout (``data`` of a diffraction
    stack). ``center=True`` decomposes ``A - 1 mean^T`` (PCA). ``client`` (default: the
    active distributed client, else dask's own scheduler) computes the reads; ``backend``
    (``numpy`` or ``cupy``) runs the block products; ``chunks`` maps item dims to the items
    of a block (default: the array's own chunks; pixel dims are always whole). ``hold=True``
    keeps the decoded blocks in the workers' memory after the first read, so the store is
    read once for the ``power_iterations + 2`` passes (``plan_sketch`` says when they fit).

    Returns a Dataset in memory: ``singular_values(component)``, ``u(item dims...,
    component)`` (orthonormal left factors), ``v(component, pixel dims...)`` (orthonormal
    right factors as images), ``explained_variance(component)`` (``s^2 / (n - 1)``),
    ``explained_variance_ratio(component)`` (``s^2`` over the stack's sum of squares,
    centred with ``center``), ``mean(pixel dims...)`` with ``center``, the input's
    coordinates and the variables of ``ds`` that are not stack-sized (positions, angles,
    ids); attrs: the options, ``passes`` (``power_iterations + 2``), ``store_reads`` (1 when
    held, else the passes), ``tasks_per_read``, ``read_seconds`` (one per pass),
    ``total_sum_of_squares`` and ``residual_fraction`` (``||A - U S V^T||_F^2 /
    ||A||_F^2``, exact for these factors). Bad input raises LayoutError or OutcoreError
    before anything is read; NaN or Inf in the stack a LayoutError after the first read.
    """
    stack = describe(ds, var)
    width = check_options(stack, rank, oversample, power_iterations, seed)
    backends.resolve(backend)
    client = _client(client)
    array = stack_array(ds[stack.var], stack, chunks)
    started = time.perf_counter()
    if hold:  # read in the first pass, held until the last
        array = array.persist() if client is None else client.persist(array)
    held_s = time.perf_counter() - started  # dask's own scheduler reads here, not in a pass
    blocks = list(array.to_delayed(optimize_graph=True).ravel())
    split = len(stack.item_dims)
    n, m = stack.items, stack.pixels
    seconds: list[float] = []

    def read(*objs: Any) -> list[Any]:
        t0 = time.perf_counter()
        out = _compute(client, *objs)
        seconds.append(round(time.perf_counter() - t0 + (0 if seconds else held_s), 6))
        return out

    v = _orth(omega(seed, m, width))
    v_d = dask.delayed(v)
    first = _tree([dask.delayed(_first_term, pure=True)(b, v_d, split, backend)
                   for b in blocks], _join_moments)
    w, sums, _, squares = read(first)[0]
    if not (np.isfinite(squares) and np.all(np.isfinite(w))):
        raise LayoutError(f"The variable {stack.var!r} holds NaN or Inf values: a sketch needs"
                          " finite values throughout.",
                          "replace them (e.g. ds[var].fillna(0)) and save the stack again.")
    mean = sums / n
    total = squares if center else squares + n * float(mean @ mean)
    if center:
        w = w - n * np.outer(mean, mean @ v)
    centre = dask.delayed(mean) if center else None
    for _ in range(power_iterations):
        v = _orth(w)
        v_d = dask.delayed(v)
        w = read(_tree([dask.delayed(_term, pure=True)(b, v_d, centre, split, backend)
                        for b in blocks], _add))[0]
    v = _orth(w)
    v_d = dask.delayed(v)
    panels = [dask.delayed(_project, pure=True)(b, v_d, centre, split, backend)
              for b in blocks]
    r, *parts = read(_tree([dask.delayed(_r_factor, pure=True)(b) for b in panels],
                           _stacked_r), *panels)
    _, s, wt = np.linalg.svd(r)
    turn = wt.T[:, :rank]
    right = v @ turn
    sign = signs(right)
    right *= sign
    s = s[:rank]
    inverse = np.divide(1.0, s, out=np.zeros_like(s), where=s > s[0] * NEGLIGIBLE * max(n, m))
    u = _place(parts, array, split) @ (turn * sign * inverse)
    return _result(ds, stack, s, u, right, mean if center else None, total, attrs={
        "source_var": stack.var, "rank": rank, "oversample": oversample, "width": width,
        "power_iterations": power_iterations, "seed": seed, "center": center,
        "passes": power_iterations + 2, "store_reads": 1 if hold else power_iterations + 2,
        "tasks_per_read": len(blocks),
        "read_seconds": seconds, "total_sum_of_squares": float(total),
        "residual_fraction": float(max(0.0, 1 - float(s @ s) / total)) if total > 0 else 0.0,
        "item_dims": list(stack.item_dims), "pixel_dims": list(stack.pixel_dims),
    })


def _block_slices(array: da.Array, split: int) -> list[tuple[slice, ...]]:
    """Where each block of ``array`` lies along the item dims, blocks in index (C) order."""
    grid = array.chunks[:split]
    starts = [np.cumsum((0, *c)) for c in grid]
    return [tuple(slice(int(starts[a][i]), int(starts[a][i + 1])) for a, i in enumerate(index))
            for index in np.ndindex(*(len(c) for c in grid))]


def _place(parts: Sequence[np.ndarray], array: da.Array, split: int) -> np.ndarray:
    """The ``(r, l)`` panels of the blocks of ``array`` (in index order) as one
    ``(items..., l)`` array."""
    out = np.empty((*array.shape[:split], parts[0].shape[-1]))
    for where, part in zip(_block_slices(array, split), parts, strict=True):
        out[where] = part.reshape(*(s.stop - s.start for s in where), -1)
    return out


def _companions(ds: xr.Dataset, stack: Stack) -> dict[str, xr.DataArray]:
    """The variables of ``ds`` besides the stack that are not stack-sized (no item dim and
    pixel dim together): positions, angles, ids, a detector mask."""
    out = {}
    for name, arr in ds.data_vars.items():
        dims = set(map(str, arr.dims))
        if name != stack.var and not (dims & set(stack.item_dims)
                                      and dims & set(stack.pixel_dims)):
            out[str(name)] = arr
    return out


def _result(ds: xr.Dataset, stack: Stack, s: np.ndarray, u: np.ndarray, right: np.ndarray,
            mean: np.ndarray | None, total: float, attrs: dict[str, Any]) -> xr.Dataset:
    rank = s.size
    coords = {name: c for name, c in ds[stack.var].coords.items()
              if set(map(str, c.dims)) <= set(stack.item_dims)
              or set(map(str, c.dims)) <= set(stack.pixel_dims)}
    variables: dict[str, Any] = {
        "singular_values": ("component", s),
        "u": ((*stack.item_dims, "component"), u),
        "v": (("component", *stack.pixel_dims), right.T.reshape(rank, *stack.pixel_shape)),
        "explained_variance": ("component", s**2 / max(1, stack.items - 1)),
        "explained_variance_ratio": ("component", s**2 / total if total > 0
                                     else np.zeros_like(s)),
    }
    if mean is not None:
        variables["mean"] = (stack.pixel_dims, mean.reshape(stack.pixel_shape))
    kept_attrs = {k: v for k, v in ds.attrs.items() if k != LAYOUT_ATTR}
    out = xr.Dataset(variables, coords={**coords, "component": np.arange(rank)},
                     attrs=kept_attrs | attrs)
    return out.assign(_companions(ds, stack))


def reconstruct(components: xr.Dataset, ds: xr.Dataset, rank: int | None = None,
                backend: str = "numpy",
                chunks: Mapping[str, int] | None = None) -> xr.Dataset:
    """``ds`` with its stack replaced by the rank-``rank`` stack ``U S V^T`` (plus the mean
    of a centred sketch) of ``components`` (``svd``'s result; default: all its components),
    lazy, block by block along the items (``chunks``: items per block by item dim, default
    the stack's own chunks), in the stack's float dtype (float32 for integer counts): the
    denoised stack, in the input's layout."""
    var = components.attrs["source_var"]
    stack = describe(ds, var)
    k = components.sizes["component"] if rank is None else rank
    item_chunks = tuple(int((chunks or {}).get(d, c))
                        for d, c in zip(stack.item_dims, stack.item_chunk, strict=True))
    u = da.from_array(components["u"].values[..., :k], chunks=(*item_chunks, k))
    f = components["singular_values"].values[:k, None] * components["v"].values[:k].reshape(
        k, -1)
    mean = components["mean"].values.ravel() if "mean" in components else None
    dtype = denoised_dtype(stack.dtype)
    split = len(stack.item_dims)
    data = da.map_blocks(
        _expand, u, dask.delayed(f), dask.delayed(mean), dtype, stack.pixel_shape, backend,
        dtype=dtype, chunks=(*u.chunks[:split], *((p,) for p in stack.pixel_shape)),
        drop_axis=split, new_axis=list(range(split, split + len(stack.pixel_shape))))
    return ds.assign({var: (ds[var].dims, data, ds[var].attrs)})
