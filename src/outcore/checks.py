"""Small checks of user options, one home for each rule: each raises ``OutcoreError`` with
the problem and the fix, before anything starts.

``flag`` is how the caller wrote the option: a keyword of a Python function (``views``, said
``views=4``) or, in the command line's own modules, a flag (``--views``, said ``--views 4``);
``what`` says what the value counts.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Sequence
from os import PathLike
from pathlib import Path, PurePath

from dask.utils import parse_bytes

from outcore.errors import InputNotFoundError, OutcoreError

__all__ = [
    "at_least",
    "choice",
    "existing_path",
    "key_values",
    "path_component",
    "positive",
    "said",
    "shape",
    "size",
    "writable_directory",
]


def said(flag: str, value: object = None) -> str:
    """How a message names option ``flag`` with ``value``: ``--views 4`` for a flag,
    ``views=4`` for a keyword (strings quoted as Python writes them); the name alone without
    a value (``--views``, ``views=``)."""
    if flag.startswith("-"):
        return flag if value is None else f"{flag} {value}"
    if value is None:
        return f"{flag}="
    return f"{flag}={value!r}"


def at_least(value: int | None, flag: str, minimum: int = 1, what: str | None = None,
             error: type[OutcoreError] = OutcoreError) -> int | None:
    """``value`` (as an int) when it is None or a whole number of at least ``minimum``, else
    ``error``; the fix names ``what`` the value counts (default: the bound itself)."""
    if value is None:
        return None
    fix = f"give {what}." if what else f"give {said(flag, minimum)} or more."
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise error(f"{said(flag, value)} is not a whole number.", fix)
    if value < minimum:
        raise error(f"{said(flag, value)} must be at least {minimum}.", fix)
    return int(value)


def positive(value: float | None, flag: str, example: str) -> float | None:
    """``value`` when it is None or above 0 (NaN is refused), else OutcoreError."""
    if value is not None and not value > 0:
        raise OutcoreError(f"{said(flag, value)} must be positive.", f"give {example}.")
    return value


def size(value: int | str | None, flag: str, error: type[OutcoreError] = OutcoreError
         ) -> int | str | None:
    """``value`` when dask reads it as a positive memory size: ``auto``, a number of bytes, a
    fraction of the machine's memory (a number up to 1) or a size such as ``4GiB``; else
    ``error`` (dask would start no worker with ``-5``, and reads ``0`` as no limit at all)."""
    if value is None or value == "auto":
        return value
    fix = ("write it like 4GiB or 500MB, a fraction of the machine's memory such as 0.25, or"
           " auto.")
    try:
        number = float(value)
    except (TypeError, ValueError):
        try:
            number = float(parse_bytes(value))
        except (TypeError, ValueError) as err:
            raise error(f"{said(flag, value)} is not a size.", fix) from err
    if not (math.isfinite(number) and number > 0):
        raise error(f"{said(flag, value)} is not a positive size.", fix)
    return value


def choice(value: str, choices: Sequence[str], flag: str) -> str:
    """``value`` when it is one of ``choices``, else OutcoreError naming them."""
    if value not in choices:
        others = f" (or {', '.join(choices[1:])})" if len(choices) > 1 else ""
        raise OutcoreError(f"{said(flag, value)} is not one of {', '.join(choices)}.",
                           f"use {said(flag, choices[0])}{others}.")
    return value


def shape(values: Sequence[int], flag: str, ndim: int = 3) -> tuple[int, ...]:
    """``ndim`` positive sizes, else OutcoreError with an example."""
    sizes = tuple(int(n) for n in values)
    if len(sizes) != ndim or min(sizes, default=0) < 1:
        example = (" ".join(["128"] * ndim) if flag.startswith("-")
                   else tuple([128] * ndim))
        given = " ".join(map(str, values)) if flag.startswith("-") else tuple(values)
        raise OutcoreError(f"{said(flag, given)} is not a shape of {ndim} positive sizes.",
                           f"give {ndim} positive sizes, e.g. {said(flag, example)}.")
    return sizes


def path_component(name: str, flag: str) -> str:
    """``name`` when it is one plain path component (no separator, not ``.`` or ``..``)."""
    if not name or name in (".", "..") or PurePath(name).name != name or "\\" in name \
            or "/" in name or "\0" in name:
        raise OutcoreError(f"{said(flag, repr(name) if flag.startswith('-') else name)} is"
                           " not a plain name: it must be one path component, without '/'"
                           " and not '.' or '..'.",
                           f"give {said(flag)} a plain name such as run1; put the parent"
                           " folder in output_dir=.")
    return name


def existing_path(path: str | PathLike[str], what: str = "input") -> Path:
    """``path`` as a Path, or InputNotFoundError when nothing is there."""
    path = Path(path).expanduser()
    if not path.exists():
        raise InputNotFoundError(
            f"The {what} {str(path)!r} does not exist.",
            "check the path (relative paths start from the current directory "
            f"{str(Path.cwd())!r}).",
        )
    return path


def key_values(items: Sequence[str], flag: str) -> dict[str, str]:
    """``KEY=VALUE`` words of a repeatable option as a dict (OutcoreError naming ``flag``)."""
    pairs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise OutcoreError(f"{said(flag, repr(item))} is not KEY=VALUE.",
                               f"write {said(flag, 'key=value')}.")
        pairs[key] = value
    return pairs


def writable_directory(path: str | PathLike[str], flag: str) -> Path:
    """``path`` when it is a directory this process can write into, or a path that can be
    made one (its nearest existing parent is a writable directory); else OutcoreError.

    Nothing is created here: the run creates the directory when it starts."""
    path = Path(path).expanduser()
    if path.exists() and not path.is_dir():
        raise OutcoreError(f"{said(flag, _path(flag, path))} is a file, not a directory.",
                           f"give {said(flag)} a directory (it is made when missing), or move"
                           " the file away.")
    parent = path
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise OutcoreError(f"{said(flag, _path(flag, path))} cannot be made: {str(parent)!r}"
                           " is a file.", f"give {said(flag)} a path under a directory.")
    if not os.access(parent, os.W_OK | os.X_OK):
        where = "" if parent == path else f" (its parent {str(parent)!r})"
        raise OutcoreError(f"{said(flag, _path(flag, path))}{where} is not writable by this"
                           " user.", f"give {said(flag)} a directory you can write to, or"
                           " change its permissions.")
    return path


def _path(flag: str, path: Path) -> str:
    """A path as ``said`` shows it: quoted after a flag; a keyword's ``repr`` quotes it."""
    return repr(str(path)) if flag.startswith("-") else str(path)
