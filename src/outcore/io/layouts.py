"""The mechanism of outcore's zarr layouts: a layout as data, a registry, and one ``validate``.

The families define their layouts (``outcore.tomo.layouts`` ...) and ``register`` them.
A :class:`Layout` lists the variables a dataset holds (dims, dtypes), the attributes it needs
(units, sizes) and which values must be finite. ``validate`` checks a dataset against one and
raises :class:`~outcore.errors.LayoutError` naming the problem and the fix; only
``check_values=True`` reads array data (one lazy pass over the arrays that must be finite).
"""

from __future__ import annotations

import importlib
import numbers
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import dask
import numpy as np
import xarray as xr

from outcore.errors import LayoutError

#: Root attribute naming a store's layout, written by ``outcore.save``.
LAYOUT_ATTR = "outcore_layout"

FLOAT = ("float32", "float64")
Dims = tuple[str, ...]


@dataclass(frozen=True)
class Var:
    """A variable (data variable or coordinate) of a layout.

    ``dims`` lists the accepted dims (one tuple per form); ``dtypes`` holds numpy dtype names
    (``"float32"``) or kind codes (``"u"``: any unsigned int). ``when`` makes the variable
    required only for that form of the layout's main variable. ``labels`` fixes a dim's
    coordinate (e.g. ``xy = ["x", "y"]``).
    """

    name: str
    dims: tuple[Dims, ...]
    dtypes: tuple[str, ...]
    doc: str
    required: bool = True
    when: Dims | None = None
    finite: bool = False
    unique: bool = False
    labels: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class Attr:
    """A root attribute: a positive number (or a list of ``sizes``) in ``unit``, or a choice.

    For a choice, ``choices`` maps each allowed string to the attrs that value needs.
    """

    name: str
    unit: str
    doc: str
    sizes: tuple[int, ...] = (1,)
    choices: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class Need:
    """Attrs a dataset must carry: all attrs of at least one of ``options``.

    ``when`` limits the need to one form of the main variable (e.g. the grid scan).
    """

    options: tuple[tuple[str, ...], ...]
    when: Dims | None = None


@dataclass(frozen=True)
class Layout:
    """One outcore layout: the main variable, its companions, its attrs and their needs."""

    name: str
    doc: str
    main: Var
    companions: tuple[Var, ...] = ()
    attrs: tuple[Attr, ...] = ()
    needs: tuple[Need, ...] = ()

    @property
    def variables(self) -> tuple[Var, ...]:
        return (self.main, *self.companions)

    def attr(self, name: str) -> Attr:
        return next(a for a in self.attrs if a.name == name)


class LayoutRegistry(Mapping[str, "Layout"]):
    """Every layout by name. The families register theirs (``register``) in the ``layouts``
    modules that ``outcore.families`` names; those are imported on the first lookup, so
    nothing here knows a family and adding one touches this module not at all. The first
    lookup imports them under a lock, and the registry counts as loaded only once every one
    is imported, so a thread looking up at the same time waits for the whole registry."""

    def __init__(self) -> None:
        self._layouts: dict[str, Layout] = {}
        self._loaded = False
        # reentrant: a family's layouts module may look a layout up while it is imported
        self._lock = threading.RLock()

    def register(self, layout: Layout) -> Layout:
        """Add ``layout`` (refusing a different one under the same name) and return it."""
        known = self._layouts.get(layout.name)
        if known is not None and known != layout:
            raise ValueError(f"a different layout named {layout.name!r} is registered")
        self._layouts[layout.name] = layout
        return layout

    def _all(self) -> dict[str, Layout]:
        if not self._loaded:
            with self._lock:
                if not self._loaded:
                    from outcore.families import FAMILIES

                    for family in FAMILIES:
                        if family.layouts:
                            importlib.import_module(family.layouts)
                    self._loaded = True
        return self._layouts

    def __getitem__(self, name: str) -> Layout:
        return self._all()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


#: Every layout by name (the families' own, loaded on first use).
LAYOUTS = LayoutRegistry()
register = LAYOUTS.register


def detect_layout(ds: xr.Dataset) -> str:
    """Name the layout of ``ds``: its ``outcore_layout`` attr, else the main variable it holds."""
    name = ds.attrs.get(LAYOUT_ATTR)
    if name is not None:
        if name not in LAYOUTS:
            raise LayoutError(
                f"The dataset's {LAYOUT_ATTR} attr is {name!r}, not a known layout.",
                f"use one of {sorted(LAYOUTS)}.",
            )
        return str(name)
    found = [lay.name for lay in LAYOUTS.values() if lay.main.name in ds.variables]
    if len(found) == 1:
        return found[0]
    mains = ", ".join(f"{lay.main.name!r} ({lay.name})" for lay in LAYOUTS.values())
    if not found:
        raise LayoutError(
            f"The dataset is not an outcore layout: it has no {LAYOUT_ATTR} attr and none of "
            f"the variables {mains}; it has {sorted(map(str, ds.variables))}.",
            "name its main variable after its layout, or convert the file with "
            "outcore.io.convert(source, output, layout=...).",
        )
    raise LayoutError(
        f"The dataset holds the main variables of several layouts: {found}.",
        f"pass layout= (one of {found}) or split the dataset.",
    )


def validate(ds: xr.Dataset, layout: str | None = None, check_values: bool = False) -> str:
    """Check ``ds`` against a layout and return the layout's name.

    Checks dims, dtypes, companion variables, required attrs (present, numeric, positive,
    of the right length) and unique ids; none of that reads array data except the 1-D
    ``candidate_id``. With ``check_values=True`` it also refuses non-finite values where the
    layout forbids them: that is a full read pass, one lazy dask reduction over those arrays.
    Raises LayoutError naming the problem and the fix.
    """
    name = _layout_name(ds, layout)
    lay = LAYOUTS[name]
    form = _check_var(ds, lay, lay.main, None)
    for var in lay.companions:
        _check_var(ds, lay, var, form)
    _check_attrs(ds, lay, form)
    if check_values:
        _check_finite(ds, lay)
    return name


def finite_variables(ds: xr.Dataset, layout: str) -> list[str]:
    """Names of the variables of ``ds`` that ``layout`` requires to be finite (float only)."""
    return [
        var.name for var in LAYOUTS[layout].variables
        if var.finite and var.name in ds.variables and ds[var.name].dtype.kind == "f"
    ]


def _layout_name(ds: xr.Dataset, layout: str | None) -> str:
    if layout is None:
        return detect_layout(ds)
    if layout not in LAYOUTS:
        raise LayoutError(f"Unknown layout {layout!r}.", f"use one of {sorted(LAYOUTS)}.")
    stored = ds.attrs.get(LAYOUT_ATTR)
    if stored is not None and stored != layout:
        raise LayoutError(
            f"layout={layout!r} was asked but the dataset's {LAYOUT_ATTR} attr is {stored!r}.",
            f"pass layout={stored!r}, or drop the attr (del ds.attrs[{LAYOUT_ATTR!r}]) to "
            "re-lay the data out.",
        )
    return layout


def _check_var(ds: xr.Dataset, lay: Layout, var: Var, form: Dims | None) -> Dims | None:
    """Check one variable; return the form (dims) it matched, or None when absent."""
    if var.name not in ds.variables:
        if var.required and (var.when is None or var.when == form):
            raise LayoutError(
                f"{lay.name} needs a variable {var.name!r} ({var.doc}) with dims "
                f"{_options(var.dims)}; the dataset has {sorted(map(str, ds.variables))}.",
                f"add it, e.g. ds[{var.name!r}] = ({var.dims[0]!r}, values) (or "
                f"arrays={{{var.name!r}: ...}} in convert).",
            )
        return None
    arr = ds[var.name]
    dims = tuple(map(str, arr.dims))
    if dims not in var.dims:
        raise LayoutError(
            f"{var.name} has dims {dims}; expected {_options(var.dims)}.",
            _dims_fix(var, dims),
        )
    if not _dtype_ok(arr.dtype, var.dtypes):
        raise LayoutError(
            f"{var.name} has dtype {arr.dtype}; {lay.name} expects {_dtype_words(var.dtypes)}.",
            f"cast it, e.g. ds[{var.name!r}] = ds[{var.name!r}].astype("
            f"{_dtype_example(var.dtypes)!r}).",
        )
    for dim, labels in var.labels.items():
        _check_labels(ds, var, dim, labels)
    if var.unique:
        _check_unique(arr)
    return dims


def _options(options: tuple[Dims, ...]) -> str:
    return " or ".join(map(str, options))


def _dims_fix(var: Var, dims: Dims) -> str:
    same = [opt for opt in var.dims if sorted(opt) == sorted(dims)]
    if same:
        return f"transpose with ds.transpose({', '.join(map(repr, same[0]))}, ...)."
    sized = [opt for opt in var.dims if len(opt) == len(dims)]
    if sized:
        extra = [d for d in dims if d not in sized[0]]
        rename = dict(zip(extra, [d for d in sized[0] if d not in dims], strict=True))
        return (
            f"rename the dims with ds.rename_dims({rename}), then transpose to "
            f"{sized[0]} if needed."
        )
    return (
        f"give {var.name} {' or '.join(str(len(opt)) for opt in var.dims)} dims, "
        f"named {_options(var.dims)}."
    )


def _dtype_ok(dtype: np.dtype, allowed: tuple[str, ...]) -> bool:
    return dtype.name in allowed or dtype.kind in allowed


_KIND_WORDS = {"u": "unsigned integers", "i": "signed integers", "U": "strings",
               "O": "strings", "T": "strings"}


def _dtype_words(allowed: tuple[str, ...]) -> str:
    words = [_KIND_WORDS.get(item, item) for item in allowed]
    return " or ".join(dict.fromkeys(words))


def _dtype_example(allowed: tuple[str, ...]) -> str:
    return "float32" if "float32" in allowed else allowed[0] if len(allowed[0]) > 1 else "int64"


def _check_labels(ds: xr.Dataset, var: Var, dim: str, labels: tuple[str, ...]) -> None:
    coord = [str(v) for v in ds[dim].values] if dim in ds.coords else None
    if ds.sizes[dim] != len(labels) or coord != list(labels):
        raise LayoutError(
            f"{var.name} needs dim {dim!r} of size {len(labels)} with coordinate "
            f"{dim}={list(labels)}; it has size {ds.sizes[dim]} and coordinate {coord}.",
            f"store the columns in that order and set ds = ds.assign_coords({dim}={list(labels)}).",
        )


def _check_unique(arr: xr.DataArray) -> None:
    values = np.asarray(arr.values)
    uniq, counts = np.unique(values, return_counts=True)
    if len(uniq) != len(values):
        dup = uniq[counts > 1][:5].tolist()
        raise LayoutError(
            f"{arr.name} has {len(values) - len(uniq)} repeated values, e.g. {dup}.",
            f"give every entry its own {arr.name}.",
        )


def _check_attrs(ds: xr.Dataset, lay: Layout, form: Dims | None) -> None:
    for attr in lay.attrs:
        if attr.name in ds.attrs:
            _check_attr(lay, attr, ds.attrs[attr.name])
    needs = [need for need in lay.needs if need.when is None or need.when == form]
    for attr in lay.attrs:
        value = ds.attrs.get(attr.name)
        if attr.choices and isinstance(value, str) and attr.choices.get(value):
            needs.append(Need((attr.choices[value],)))
    for need in needs:
        if not any(all(a in ds.attrs for a in option) for option in need.options):
            missing = " or ".join(
                " and ".join(f"{a} [{lay.attr(a).unit}]" for a in option) for option in need.options
            )
            example = ", ".join(f"{a!r}: ..." for a in need.options[0])
            raise LayoutError(
                f"{lay.name} needs the attr {missing}; the dataset has "
                f"{sorted(map(str, ds.attrs))}.",
                f"set it, e.g. ds.attrs.update({{{example}}}) (or attrs={{...}} in convert).",
            )


def _check_attr(lay: Layout, attr: Attr, value: object) -> None:
    if attr.choices:
        if not isinstance(value, str) or value not in attr.choices:
            raise LayoutError(
                f"{lay.name} attr {attr.name} is {value!r}; expected one of {list(attr.choices)}.",
                f"set ds.attrs[{attr.name!r}] to one of {list(attr.choices)}.",
            )
        return
    values = value if isinstance(value, list | tuple | np.ndarray) else [value]
    sizes = " or ".join("a number" if n == 1 else f"a list of {n}" for n in attr.sizes)
    if np.ndim(values) != 1 or len(values) not in attr.sizes or not all(
        isinstance(v, numbers.Real) and not isinstance(v, bool | np.bool_) for v in values
    ):
        raise LayoutError(
            f"{lay.name} attr {attr.name} ({attr.doc}) is {value!r}; expected {sizes} "
            f"in {attr.unit}.",
            f"set ds.attrs[{attr.name!r}] to {sizes} in {attr.unit}.",
        )
    if not all(np.isfinite(v) and v > 0 for v in values):
        raise LayoutError(
            f"{lay.name} attr {attr.name} is {value!r}; it must be finite and positive "
            f"(in {attr.unit}).",
            f"set ds.attrs[{attr.name!r}] to the positive value in {attr.unit}.",
        )


def _check_finite(ds: xr.Dataset, lay: Layout) -> None:
    names = finite_variables(ds, lay.name)
    counts = dask.compute(*[(~np.isfinite(ds[name].data)).sum() for name in names])
    for name, count in zip(names, counts, strict=True):
        if count:
            raise LayoutError(
                f"{name} has {int(count)} non-finite values (NaN or Inf); {lay.name} "
                "refuses them.",
                f"replace them before saving, e.g. ds[{name!r}] = ds[{name!r}].fillna(0), "
                "or mask the bad frames out.",
            )
