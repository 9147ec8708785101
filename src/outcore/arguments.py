"""The arguments of public functions: keywords checked, data found by its dimension names.

``keywords_checked`` wraps a public function so that an unknown or missing argument is one
``ArgumentError`` naming it (and the keyword it may have meant), not Python's ``TypeError``
from deep inside. ``data_array`` and ``dataset`` take what a user holds (an
``xarray.Dataset`` or ``DataArray``, numpy- or dask-backed, any chunking, or the path of an
outcore store) and return it with its dimensions in the order the function works in: a
transposed input is reordered, never misread; a bare array, whose axes have no names, is
refused with the line that wraps it.
"""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Callable, Sequence
from os import PathLike
from typing import Any, TypeVar

import xarray as xr

from outcore.errors import ArgumentError, LayoutError

__all__ = ["data_array", "dataset", "keywords_checked"]

F = TypeVar("F", bound=Callable[..., Any])


def keywords_checked(func: F) -> F:
    """``func`` with its arguments checked against its signature first: an unknown keyword,
    a missing or surplus positional argument is one ``ArgumentError`` naming it."""
    signature = inspect.signature(func)
    known = [name for name, p in signature.parameters.items()
             if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]

    @functools.wraps(func)
    def checked(*args: Any, **kwargs: Any) -> Any:
        try:
            signature.bind(*args, **kwargs)
        except TypeError as err:
            raise _argument_error(func.__name__, known, kwargs, err) from None
        return func(*args, **kwargs)

    return checked  # type: ignore[return-value]


def _argument_error(name: str, known: Sequence[str], kwargs: dict[str, Any],
                    err: TypeError) -> ArgumentError:
    unknown = [k for k in kwargs if k not in known]
    if unknown:
        close = difflib.get_close_matches(unknown[0], known, n=1)
        hint = f"did you mean {close[0]}=? " if close else ""
        return ArgumentError(f"{name}() takes no keyword {unknown[0]}=.",
                             f"{hint}its keywords are {', '.join(k + '=' for k in known)}.")
    return ArgumentError(f"{name}(): {err}.", f"see help({name}) for its arguments.")


def dataset(value: Any, argument: str, layout: str | None = None) -> xr.Dataset:
    """``value`` as a Dataset: a Dataset as it is, a DataArray as a Dataset of it, a path
    as the outcore store there (opened lazily, ``layout`` checked); anything else is an
    ``ArgumentError`` naming ``argument``."""
    if isinstance(value, xr.Dataset):
        return value
    if isinstance(value, xr.DataArray):
        return value.to_dataset(name=value.name or "data")
    if isinstance(value, str | PathLike):
        from outcore.io.store import open as open_store

        return open_store(value, layout=layout)
    raise ArgumentError(f"{argument}= is a {type(value).__name__}, not an xarray Dataset,"
                        " a DataArray or the path of a store.",
                        f"pass {argument}=xr.Dataset(...) or the store's path (outcore.save"
                        " writes one).")


def data_array(value: Any, dims: Sequence[str], argument: str, *,
               names: Sequence[str] = ()) -> xr.DataArray:
    """The array of ``value`` whose dimensions are ``dims``, in that order.

    ``value``: a DataArray with those dims in any order; a Dataset (or a store's path)
    holding one, found by the first of ``names`` it has, else as its only variable with
    exactly those dims. A numpy or dask array is refused (its axes have no names): the fix
    shows the ``xr.DataArray(..., dims=...)`` that names them."""
    want = tuple(dims)
    if isinstance(value, str | PathLike):
        value = dataset(value, argument)
    if isinstance(value, xr.Dataset):
        value = _variable(value, want, argument, names)
    if not isinstance(value, xr.DataArray):
        kind = type(value).__name__
        raise ArgumentError(f"{argument}= is a {kind} without dimension names; outcore"
                            f" needs to know which axis is which of {want}.",
                            f"wrap it: {argument}=xr.DataArray(array, dims={want}).")
    if set(value.dims) != set(want) or value.ndim != len(want):
        raise LayoutError(f"{argument}= has dims {tuple(value.dims)}; it needs {want}"
                          " (in any order).",
                          f"rename its dims, e.g. {argument}.rename({{...}}), or pass the"
                          " array that has them.")
    return value.transpose(*want)


def _variable(ds: xr.Dataset, dims: tuple[str, ...], argument: str,
              names: Sequence[str]) -> xr.DataArray:
    for name in names:
        if name in ds.data_vars:
            return ds[name]
    fitting = [name for name, v in ds.data_vars.items() if set(v.dims) == set(dims)]
    if len(fitting) == 1:
        return ds[fitting[0]]
    held = ", ".join(f"{name}{tuple(v.dims)}" for name, v in ds.data_vars.items()) or "nothing"
    which = "none" if not fitting else f"{len(fitting)} ({', '.join(map(str, fitting))})"
    raise LayoutError(f"{argument}= holds {held}: {which} of its variables has dims {dims}.",
                      f"pass the variable itself, e.g. {argument}=ds[name].")
