"""The stack a sketch reads: one variable of a dataset seen as a matrix of items by pixels.

The leading dims of the variable are the items (the rows), the last two (the last one of a
2-D variable) the pixels (the columns): ``scan_y, scan_x`` or ``position`` by ``k_y, k_x``
for a diffraction stack, ``view`` by ``v, u`` for projections, ``candidate`` by ``y, x`` for
a cutout catalog, ``z`` by ``y, x`` for a volume. ``describe`` checks the variable and
``check_options`` the sketch's options against it, reading no array data, so bad input fails
in one line before any compute. A task holds whole patterns: ``item_chunkings`` lists the
chunkings along the items a plan may choose, whole store chunks merged.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from os import PathLike

import dask.array as da
import numpy as np
import xarray as xr

from outcore.checks import at_least
from outcore.errors import LayoutError, OutcoreError
from outcore.io.layouts import LAYOUT_ATTR, LAYOUTS, validate
from outcore.io.store import open_unchecked

__all__ = ["Stack", "check_options", "default_variable", "describe", "item_chunkings",
           "open_stack", "ordered"]


@dataclass(frozen=True)
class Stack:
    """A variable as a matrix: ``item_dims`` (rows) by ``pixel_dims`` (columns), their sizes,
    its dtype and the chunks it is stored in (``store_chunks``, the largest per dim)."""

    var: str
    item_dims: tuple[str, ...]
    pixel_dims: tuple[str, ...]
    item_shape: tuple[int, ...]
    pixel_shape: tuple[int, ...]
    dtype: np.dtype
    store_chunks: tuple[int, ...]

    @property
    def items(self) -> int:
        return math.prod(self.item_shape)

    @property
    def pixels(self) -> int:
        return math.prod(self.pixel_shape)

    @property
    def nbytes(self) -> int:
        return self.items * self.pixels * self.dtype.itemsize

    @property
    def item_chunk(self) -> tuple[int, ...]:
        """The store's chunk along the item dims."""
        return self.store_chunks[:len(self.item_dims)]

    def chunks(self, item_chunk: tuple[int, ...]) -> dict[str, int]:
        """The dask chunks (dim -> size) of blocks of ``item_chunk`` items, whole patterns."""
        return {**dict(zip(self.item_dims, item_chunk, strict=True)),
                **dict(zip(self.pixel_dims, self.pixel_shape, strict=True))}

    def tasks(self, item_chunk: tuple[int, ...]) -> int:
        """Blocks (the tasks of one read) of the chunking ``item_chunk``."""
        return math.prod(-(-n // c) for n, c in zip(self.item_shape, item_chunk, strict=True))


def default_variable(ds: xr.Dataset) -> str:
    """The main variable of the dataset's layout (``data`` of a diffraction stack,
    ``projections``, ``images``, ``volume``), else ``data``."""
    layout = ds.attrs.get(LAYOUT_ATTR)
    if layout in LAYOUTS:
        return LAYOUTS[layout].main.name
    found = [lay.main.name for lay in LAYOUTS.values() if lay.main.name in ds.data_vars]
    return found[0] if len(found) == 1 else "data"


def open_stack(path: str | PathLike[str], chunks: Mapping[str, int] | None = None
               ) -> tuple[xr.Dataset, str | None]:
    """The store at ``path`` (lazily, with ``chunks``), validated against its layout when it
    names one, and that layout's name (None for a store without one, e.g. a run's output)."""
    ds = open_unchecked(path, chunks)
    if LAYOUT_ATTR not in ds.attrs:
        return ds, None
    return ds, validate(ds)


def ordered(ds: xr.Dataset, var: str | None = None) -> xr.Dataset:
    """``ds`` with ``ds[var]`` (default: ``default_variable``) in the dim order of the layout
    whose main variable it is, where its dims are that layout's in another order
    (``(k_y, k_x, scan_y, scan_x)`` becomes ``(scan_y, scan_x, k_y, k_x)``); else as it is."""
    var = default_variable(ds) if var is None else var
    if var not in ds.data_vars:
        return ds
    dims = tuple(map(str, ds[var].dims))
    for layout in LAYOUTS.values():
        for form in layout.main.dims:
            if layout.main.name == var and set(form) == set(dims) and form != dims:
                return ds.assign({var: ds[var].transpose(*form)})
    return ds


def describe(ds: xr.Dataset, var: str | None = None) -> Stack:
    """The stack of ``ds[var]`` (default: ``default_variable``). LayoutError for a missing
    variable, one of fewer than two dims, complex or non-numeric values, or an empty one."""
    var = default_variable(ds) if var is None else var
    if var not in ds.data_vars:
        names = ", ".join(map(str, ds.data_vars)) or "none"
        raise LayoutError(f"The dataset has no variable {var!r} (its variables: {names}).",
                          "give var= the name of the stack to decompose.")
    data = ds[var]
    if data.ndim < 2:
        raise LayoutError(f"The variable {var!r} has dims {data.dims}: a sketch needs items"
                          " by pixels, two dims or more.", "give var= a stack of patterns.")
    dtype = np.dtype(data.dtype)
    if dtype.kind == "c":
        raise LayoutError(f"The variable {var!r} is complex ({dtype}): the sketch decomposes"
                          " real stacks only.", "decompose its real and imaginary parts (or"
                          " its modulus) saved as real variables.")
    if dtype.kind not in "fiu":
        raise LayoutError(f"The variable {var!r} holds {dtype} values, not numbers.",
                          "give var= a variable of float or integer values.")
    if data.size == 0:
        raise LayoutError(f"The variable {var!r} is empty (shape {data.shape}).",
                          "give a stack with at least one item and one pixel.")
    split = data.ndim - (2 if data.ndim >= 3 else 1)
    dims = tuple(map(str, data.dims))
    if isinstance(data.data, da.Array):
        chunks = tuple(max(c) for c in data.chunks)
    else:  # in memory: a block may take any items
        chunks = (1,) * split + data.shape[split:]
    return Stack(var, dims[:split], dims[split:], tuple(data.shape[:split]),
                 tuple(data.shape[split:]), dtype, tuple(int(c) for c in chunks))


def check_options(stack: Stack, rank: int, oversample: int, power_iterations: int,
                  seed: int) -> int:
    """Refuse a rank under 1 or above the smaller side of the matrix, and a negative
    oversampling, power-iteration count or seed (OutcoreError, one line); return the
    sketch's width ``l``: the rank plus the oversampling, at most the smaller side."""
    smaller = min(stack.items, stack.pixels)
    at_least(rank, "rank", 1, "rank=1 or more (the number of components)")
    if rank > smaller:
        raise OutcoreError(
            f"rank={rank} is above the stack's smaller side: {stack.items} items by"
            f" {stack.pixels} pixels have at most {smaller} components.",
            f"give rank={smaller} or less.")
    at_least(oversample, "oversample", 0, "oversample=0 or more (10 is usual)")
    at_least(power_iterations, "power_iterations", 0,
             "power_iterations=0 or more (2 is usual)")
    at_least(seed, "seed", 0, "seed=0 or more")
    return min(rank + oversample, smaller)


def item_chunkings(stack: Stack) -> list[tuple[int, ...]]:
    """The chunkings along the items a plan may choose from, smallest first: the store's
    chunk, then whole store chunks merged, the innermost item dim doubled until it is whole,
    then the next one out, up to the whole stack in one block. A block never splits a
    store chunk (its read would decode the whole chunk anyway)."""
    current = list(stack.item_chunk)
    out = [tuple(current)]
    for axis in reversed(range(len(current))):
        while current[axis] < stack.item_shape[axis]:
            current[axis] = min(current[axis] * 2, stack.item_shape[axis])
            out.append(tuple(current))
    return out
