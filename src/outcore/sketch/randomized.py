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

import contextlib
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import Any

import dask
import dask.array as da
import distributed
import numpy as np
import xarray as xr
from dask.delayed import Delayed

from outcore import backend as backends
from outcore import progress, session
from outcore.arguments import dataset, keywords_checked
from outcore.errors import ArgumentError, LayoutError, OutcoreError
from outcore.io.layouts import LAYOUT_ATTR
from outcore.io.store import read_array
from outcore.plan import Plan, Resources
from outcore.sketch import kernels
from outcore.sketch.draws import omega
from outcore.sketch.memory import FAN_IN, denoised_dtype, plan_fixes, plan_sketch
from outcore.sketch.stack import Stack, check_options, describe, open_stack, ordered

__all__ = ["plan_svd", "reconstruct", "svd"]

#: What ``svd`` takes: a Dataset, a DataArray, or the path of a store.
Data = xr.Dataset | xr.DataArray | str | PathLike

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


def _first_term(block: np.ndarray, v: np.ndarray, split: int, backend: str, last: bool
                ) -> tuple[np.ndarray, np.ndarray, int]:
    """The first read's term of a block: ``A^T (A V)``, column sums, rows (in float64 when
    it is the search's ``last`` pass)."""
    a = _matrix(block, split, backend)
    w, sums = kernels.first_pass(a, v, last)
    return backends.to_host(w), backends.to_host(sums), a.shape[0]


def _add(*terms: Any) -> Any:
    """``terms`` (arrays, numbers, or tuples of them, added item by item) added left to
    right."""
    if isinstance(terms[0], tuple):
        return tuple(_add(*parts) for parts in zip(*terms, strict=True))
    total = terms[0]
    for term in terms[1:]:
        total = total + term
    return total


def _term(block: np.ndarray, v: np.ndarray, mean: np.ndarray | None, split: int,
          backend: str, last: bool) -> np.ndarray:
    """A power read's term of a block: ``A_c^T (A_c V)`` (in float64 when it is the
    search's ``last`` pass)."""
    offset = None if mean is None else mean @ v
    return backends.to_host(kernels.normal_product(_matrix(block, split, backend), v, mean,
                                                   offset, last))


def _final_term(block: np.ndarray, v: np.ndarray, mean: np.ndarray, center: bool, split: int,
                backend: str) -> tuple[np.ndarray, tuple[np.ndarray, float]]:
    """The last read's terms of a block: its panel ``A_c V`` ``(r, l)``, and the panel's R
    factor with the squared deviations of the block's values from the stack's mean
    pattern."""
    panel, squares = kernels.final_pass(_matrix(block, split, backend), v, mean,
                                        mean @ v if center else None)
    panel = backends.to_host(panel)
    return panel, (np.linalg.qr(panel, mode="r"), float(backends.to_host(squares)))


def _stack_r(*terms: tuple[np.ndarray, float]) -> tuple[np.ndarray, float]:
    """The R factor of the panels whose R factors ``terms`` hold, stacked in order, and
    their squared deviations added left to right."""
    r = np.linalg.qr(np.concatenate([t[0] for t in terms], axis=0), mode="r")
    return r, _add(*(t[1] for t in terms))


def _expand(u: np.ndarray, f: np.ndarray, mean: np.ndarray | None, dtype: np.dtype,
            pixel_shape: tuple[int, ...], backend: str) -> np.ndarray:
    """A block of the rank-``k`` stack from its ``(items..., k)`` scaled left factors."""
    rows = u.shape[:-1]
    x = backends.to_backend(np.ascontiguousarray(u).reshape(-1, u.shape[-1]), backend)
    return backends.to_host(kernels.expand(x, f, mean, dtype)).reshape(*rows, *pixel_shape)


# --- the graph --------------------------------------------------------------------------------


class _Passes:
    """Each pass's seconds: ``seconds`` its wall time; ``decode`` and ``products`` the
    seconds the workers' threads spent in its tasks that read and decode blocks of the
    stack (the dask array's tasks, whose keys are tuples) and in its products and sums (the
    delayed tasks), added over the threads (on 2 busy threads they add up to twice the
    wall time), from the scheduler's task stream."""

    def __init__(self, client: distributed.Client) -> None:
        self.client = client
        self.seconds: list[float] = []
        self.decode: list[float] = []
        self.products: list[float] = []

    @contextlib.contextmanager
    def timed(self) -> Iterator[None]:
        t0 = time.perf_counter()
        with distributed.get_task_stream(self.client) as stream:
            yield
        self.seconds.append(round(time.perf_counter() - t0, 6))
        spent = {True: 0.0, False: 0.0}
        for task in stream.data:
            computed = sum(s["stop"] - s["start"] for s in task.get("startstops", ())
                           if s.get("action") == "compute")
            spent[not isinstance(task["key"], tuple)] += computed
        self.decode.append(round(spent[False], 6))
        self.products.append(round(spent[True], 6))


def _tree(parts: Sequence[Delayed], combine: Callable[..., Any]) -> Delayed:
    """``parts`` reduced by ``combine`` in a fixed tree: ``FAN_IN`` neighbours at a time in
    index order, level by level, the same tree on any cluster."""
    level = list(parts)
    while len(level) > 1:
        level = [dask.delayed(combine, pure=True)(*level[i:i + FAN_IN])
                 for i in range(0, len(level), FAN_IN)]
    return level[0]


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
    chunk."""
    array = data.data
    current = (dict(zip(data.dims, (max(c) for c in array.chunks), strict=True))
               if isinstance(array, da.Array) else dict(zip(data.dims, stack.store_chunks,
                                                            strict=True)))
    wanted = {**current, **dict(chunks or {}),
              **dict(zip(stack.pixel_dims, stack.pixel_shape, strict=True))}
    if not isinstance(array, da.Array):
        return da.from_array(np.asarray(array), chunks=tuple(wanted[d] for d in data.dims))
    if any(len(c) > 1 and d in stack.pixel_dims or current[d] != wanted[d]
           for d, c in zip(data.dims, array.chunks, strict=True)):
        array = array.rechunk(tuple(wanted[d] for d in data.dims))
    return array


@dataclass(frozen=True)
class _Sketch:
    """The checked arguments of a sketch: the dataset (its stack in its layout's dim order),
    the stack, the sketch's width and options, the store it came from (None for data in
    hand), the blocks asked for (None: the plan's choice) and whether to hold them."""

    ds: xr.Dataset
    stack: Stack
    width: int
    rank: int
    power_iterations: int
    backend: str
    source: Path | None
    item_chunk: tuple[int, ...] | None
    hold: bool | None

    def plan(self, resources: Resources, denoise: bool = False) -> Plan:
        """The plan of this sketch on ``resources`` (``memory.plan_sketch``): nothing read."""
        return plan_sketch(self.stack, resources, self.width, self.rank,
                           self.power_iterations, denoise=denoise, item_chunk=self.item_chunk,
                           hold=self.hold)

    def blocks(self, item_chunk: tuple[int, ...]) -> xr.Dataset:
        """The dataset with its stack in blocks of ``item_chunk`` items: a store's stack read
        in those blocks (each read task decodes its whole chunks into its block,
        ``io.store.read_array``), data in hand rechunked."""
        chunks = self.stack.chunks(item_chunk)
        if self.source is None:
            return self.ds
        ds = open_stack(self.source, chunks)[0]
        stored = ds[self.stack.var]  # in the store's dim order, which ordered() reorders
        data = read_array(self.source, self.stack.var, tuple(chunks[str(d)]
                                                             for d in stored.dims))
        return ordered(ds.assign({self.stack.var: stored.copy(data=data)}), self.stack.var)


def _sketch_of(data: Data, rank: int, var: str | None, oversample: int,
               power_iterations: int, seed: int, center: bool,
               chunks: Mapping[str, int] | None, hold: bool | None, backend: str) -> _Sketch:
    """The arguments of ``svd`` checked, reading no array data: one ``OutcoreError`` naming
    the first that is wrong."""
    source = None
    if isinstance(data, str | PathLike):
        source = Path(data).expanduser()
        data = open_stack(source)[0]
    if isinstance(data, np.ndarray | da.Array):
        raise ArgumentError(f"data= is a {type(data).__name__} without dimension names:"
                            " outcore needs to know which axes are the items and which the"
                            " pixels.", "wrap it: data=xr.DataArray(array, dims=('scan_y',"
                            " 'scan_x', 'k_y', 'k_x')), the items first, the pixels (the last"
                            " two) last.")
    if isinstance(data, xr.DataArray) and var is None:
        var = str(data.name) if data.name is not None else "data"
    ds = ordered(dataset(data, "data"), var)
    stack = describe(ds, var)
    width = check_options(stack, rank, oversample, power_iterations, seed)
    if not isinstance(center, bool | np.bool_):
        raise ArgumentError(f"center={center!r} is not True or False.",
                            "give center=True (PCA: the mean pattern subtracted) or False.")
    if hold is not None and not isinstance(hold, bool | np.bool_):
        raise ArgumentError(f"hold={hold!r} is not True, False or None.",
                            "give hold=None (the plan's choice), True or False.")
    item_chunk = None
    if chunks is not None:
        if not isinstance(chunks, Mapping):
            raise ArgumentError(f"chunks={chunks!r} is not a mapping of item dims to items.",
                                f"give e.g. chunks={{'{stack.item_dims[0]}': 8}}.")
        unknown = set(chunks) - set(stack.item_dims)
        if unknown:
            raise LayoutError(f"chunks= names {sorted(unknown)}, not among the item dims"
                              f" {list(stack.item_dims)} (a block holds whole patterns).",
                              f"name item dims only, e.g. chunks={{'{stack.item_dims[0]}':"
                              " 8}.")
        for dim, items in chunks.items():
            if isinstance(items, bool) or not isinstance(items, int) or items < 1:
                raise LayoutError(f"chunks={{'{dim}': {items!r}}} is not a positive number of"
                                  " items.", f"give chunks={{'{dim}': 8}} or another whole"
                                  " number of 1 or more.")
        kept = (stack.item_chunk if isinstance(ds[stack.var].data, da.Array)
                else stack.item_shape)  # dims left out: their chunks, or whole in memory
        item_chunk = tuple(int(chunks.get(d, c))
                           for d, c in zip(stack.item_dims, kept, strict=True))
    return _Sketch(ds, stack, width, rank, power_iterations, backends.resolve(backend),
                   source, item_chunk, hold)


@keywords_checked
def plan_svd(data: Data, rank: int, *, var: str | None = None, oversample: int = 10,
             power_iterations: int = 2, seed: int = 0, center: bool = False,
             chunks: Mapping[str, int] | None = None, hold: bool | None = None,
             denoise: bool = False, backend: str = "numpy",
             client: distributed.Client | None = None,
             resources: Resources | None = None) -> Plan:
    """The memory plan of ``svd(data, rank, ...)`` with the same arguments, reading no
    array data: the blocks it would read and the bytes of each kind of task against the
    workers of ``client`` (default: the running client, see ``svd``) or the given
    ``resources``; ``denoise=True`` also counts writing the rank-``k`` stack
    (``reconstruct``). ``print(plan.table())`` shows it; ``plan.fits`` says whether it fits
    (``svd`` refuses one that does not)."""
    sketch = _sketch_of(data, rank, var, oversample, power_iterations, seed, center, chunks,
                        hold, backend)
    if resources is None:
        resources = session.resources_for(session.client_for(client), sketch.backend)
    return sketch.plan(resources, denoise)


@keywords_checked
def svd(data: Data, rank: int, *, var: str | None = None, oversample: int = 10,
        power_iterations: int = 2, seed: int = 0, center: bool = False,
        chunks: Mapping[str, int] | None = None, hold: bool | None = None,
        backend: str = "numpy", client: distributed.Client | None = None,
        plan: Plan | None = None) -> xr.Dataset:
    """The ``rank`` leading singular triplets of a stack (items by pixels, see
    ``outcore.sketch.stack``) from a randomized sketch of width ``l = rank + oversample``
    with ``power_iterations`` power reads: ``power_iterations + 2`` reads of the stack. It
    computes (the reads run at once, with a progress bar) and returns the factors in memory.

    ``data``: a Dataset (``var``: the stack's variable, default the main one of its
    layout, e.g. ``data`` of a diffraction stack), a DataArray, numpy- or dask-backed, or
    the path of a store. A stack whose dims are its layout's in another order is reordered
    (``(k_y, k_x, scan_y, scan_x)`` is read as ``(scan_y, scan_x, k_y, k_x)``).
    ``center=True`` decomposes ``A - 1 mean^T`` (PCA). ``backend`` (``numpy`` or ``cupy``)
    runs the block products. ``chunks`` maps item dims to the items of a block and ``hold``
    keeps the decoded blocks in the workers' memory after the first read (the store read
    once for the ``power_iterations + 2`` passes); by default the plan chooses both for the
    workers (``plan_svd`` shows it).

    Runs on ``client``, else the Dask client you started, else a cluster of this process
    started once; a plan that does not fit the workers' memory is one ``PlanError`` before
    any read, naming ``memory_limit=`` and what shrinks the tasks. ``plan``: a plan already
    made and checked (the command line's), used as it is.

    Returns a Dataset: ``singular_values(component)`` (in the stack's units),
    ``u(item dims..., component)`` (orthonormal left factors), ``v(component, pixel
    dims...)`` (orthonormal right factors as images), ``explained_variance(component)``
    (``s^2 / (n - 1)``), ``explained_variance_ratio(component)`` (``s^2`` over the stack's
    sum of squares, centred with ``center``), ``mean(pixel dims...)`` with ``center``; the
    input's coordinates (integer ones, ``units: "pixel"``, on dims without any) and its
    variables that are not stack-sized (positions, angles, ids); attrs: the options,
    ``passes`` (``power_iterations + 2``), ``store_reads`` (1 when held, else the passes),
    ``tasks_per_read``, ``block_items``, ``read_seconds`` (one per pass),
    ``total_sum_of_squares`` and ``residual_fraction`` (``||A - U S V^T||_F^2 /
    ||A||_F^2``, exact for these factors). Bad input is one ``OutcoreError`` before anything
    is read; NaN or Inf in the stack a ``LayoutError`` after the first read.
    """
    sketch = _sketch_of(data, rank, var, oversample, power_iterations, seed, center, chunks,
                        hold, backend)
    client = session.client_for(client)
    plan = session.fitted_plan(sketch.plan, client, sketch.backend, plan=plan,
                               fixes=plan_fixes(sketch.stack))
    item_chunk = tuple(plan.choices)
    ds, stack = sketch.blocks(item_chunk), sketch.stack
    array = stack_array(ds[stack.var], stack, dict(zip(stack.item_dims, item_chunk,
                                                       strict=True)))
    return _decompose(ds, stack, array, client, rank=rank, oversample=oversample,
                      width=sketch.width, power_iterations=power_iterations, seed=seed,
                      center=center, hold=bool(plan.config["hold"]), backend=sketch.backend)


def _decompose(ds: xr.Dataset, stack: Stack, array: da.Array, client: distributed.Client, *,
               rank: int, oversample: int, width: int, power_iterations: int, seed: int,
               center: bool, hold: bool, backend: str) -> xr.Dataset:
    """The sketch of ``array`` (``ds``'s stack in its blocks) on ``client``: the reads, then
    the small SVD on the client (see the module's docstring)."""
    passes = _Passes(client)
    with passes.timed():  # the first pass: the store read (and held), A^T A V_0, the sums
        if hold:  # read in the first pass, held until the last
            array = client.persist(array)
        blocks = list(array.to_delayed(optimize_graph=True).ravel())
        split = len(stack.item_dims)
        n, m = stack.items, stack.pixels
        v = _orth(omega(seed, m, width))
        v_d = dask.delayed(v)
        w, sums, _ = progress.compute(client, _tree(
            [dask.delayed(_first_term, pure=True)(b, v_d, split, backend, power_iterations == 0)
             for b in blocks],
            _add))[0]
    if not (np.all(np.isfinite(sums)) and np.all(np.isfinite(w))):
        raise LayoutError(f"The variable {stack.var!r} holds NaN or Inf values: a sketch needs"
                          " finite values throughout.",
                          "replace them (e.g. ds[var].fillna(0)) and save the stack again.")
    mean = sums / n
    if center:
        w = w - n * np.outer(mean, mean @ v)
    centre = dask.delayed(mean) if center else None
    for i in range(power_iterations):
        v = _orth(w)
        v_d = dask.delayed(v)
        last = i == power_iterations - 1
        with passes.timed():
            w = progress.compute(client, _tree(
                [dask.delayed(_term, pure=True)(b, v_d, centre, split, backend, last)
                 for b in blocks], _add))[0]
    v = _orth(w)
    v_d = dask.delayed(v)
    finals = [dask.delayed(_final_term, pure=True, nout=2)(b, v_d, dask.delayed(mean), center,
                                                           split, backend) for b in blocks]
    with passes.timed():
        (r, squares), *parts = progress.compute(
            client, _tree([f[1] for f in finals], _stack_r), *(f[0] for f in finals))
    total = squares if center else squares + n * float(mean @ mean)
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
        "block_items": [int(max(c)) for c in array.chunks[:split]],
        "read_seconds": passes.seconds, "decode_seconds": passes.decode,
        "product_seconds": passes.products, "total_sum_of_squares": float(total),
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
    data = ds[stack.var]
    coords: dict[str, Any] = {
        str(name): c for name, c in data.coords.items()
        if set(map(str, c.dims)) <= set(stack.item_dims)
        or set(map(str, c.dims)) <= set(stack.pixel_dims)}
    for dim, size in zip((*stack.item_dims, *stack.pixel_dims),
                         (*stack.item_shape, *stack.pixel_shape), strict=True):
        if dim not in coords:  # no coordinate of its own: the index, in pixels
            coords[dim] = xr.Variable(dim, np.arange(size), {"units": "pixel"})
    coords["component"] = xr.Variable("component", np.arange(rank),
                                      {"long_name": "component, by decreasing singular value"})
    unit = data.attrs.get("units")
    values = {} if unit is None else {"units": str(unit)}
    squared = {} if unit is None else {"units": f"({unit})^2"}
    variables: dict[str, Any] = {
        "singular_values": ("component", s, values),
        "u": ((*stack.item_dims, "component"), u, {"long_name": "left factors (unit norm)"}),
        "v": (("component", *stack.pixel_dims), right.T.reshape(rank, *stack.pixel_shape),
              {"long_name": "right factors (unit norm)"}),
        "explained_variance": ("component", s**2 / max(1, stack.items - 1), squared),
        "explained_variance_ratio": ("component", s**2 / total if total > 0
                                     else np.zeros_like(s)),
    }
    if mean is not None:
        variables["mean"] = (stack.pixel_dims, mean.reshape(stack.pixel_shape), values)
    kept_attrs = {k: v for k, v in ds.attrs.items() if k != LAYOUT_ATTR}
    out = xr.Dataset(variables, coords=coords, attrs=kept_attrs | attrs)
    return out.assign(_companions(ds, stack))


@keywords_checked
def reconstruct(components: xr.Dataset, data: Data, *, rank: int | None = None,
                chunks: Mapping[str, int] | None = None,
                backend: str = "numpy") -> xr.Dataset:
    """``data`` (what ``svd`` decomposed: a Dataset, a DataArray or a store's path) with its
    stack replaced by the rank-``rank`` stack ``U S V^T`` (plus the mean of a centred
    sketch) of ``components`` (``svd``'s result; default: all its components): the denoised
    stack, in the input's layout and the stack's float dtype (float32 for integer counts).
    Lazy: nothing is computed, block by block along the items (``chunks``: items per block
    by item dim, default the sketch's blocks)."""
    if not isinstance(components, xr.Dataset) or "source_var" not in components.attrs:
        raise ArgumentError(f"components= is a {type(components).__name__}, not the result"
                            " of svd.", "pass the Dataset svd returns.")
    var = components.attrs["source_var"]
    if isinstance(data, str | PathLike):
        data = open_stack(data)[0]
    ds = ordered(dataset(data, "data"), var)
    stack = describe(ds, var)
    k = components.sizes["component"]
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int)
                             or not 1 <= rank <= k):
        raise OutcoreError(f"rank={rank!r} is not a number of components from 1 to {k}"
                           " (those of components=).", f"give rank={k} or less.")
    k = k if rank is None else rank
    shape = tuple(components["u"].shape[:-1])
    if shape != stack.item_shape or tuple(components["v"].shape[1:]) != stack.pixel_shape:
        raise LayoutError(f"components= are of a stack of {shape} items by"
                          f" {tuple(components['v'].shape[1:])} pixels, not of this one"
                          f" ({stack.item_shape} by {stack.pixel_shape}).",
                          "pass the data svd decomposed.")
    blocks = components.attrs.get("block_items", stack.item_chunk)
    item_chunks = tuple(int((chunks or {}).get(d, c))
                        for d, c in zip(stack.item_dims, blocks, strict=True))
    u = da.from_array(components["u"].values[..., :k], chunks=(*item_chunks, k))
    f = components["singular_values"].values[:k, None] * components["v"].values[:k].reshape(
        k, -1)
    mean = components["mean"].values.ravel() if "mean" in components else None
    dtype = denoised_dtype(stack.dtype)
    split = len(stack.item_dims)
    data = da.map_blocks(
        _expand, u, dask.delayed(f), dask.delayed(mean), dtype, stack.pixel_shape,
        backends.resolve(backend), dtype=dtype,
        chunks=(*u.chunks[:split], *((p,) for p in stack.pixel_shape)),
        drop_axis=split, new_axis=list(range(split, split + len(stack.pixel_shape))))
    return ds.assign({var: (ds[var].dims, data, ds[var].attrs)})
