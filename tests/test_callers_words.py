"""Errors in the caller's words: keywords from Python, flags from the command line.

The library names keywords (``memory_limit=``); the command line rewrites those its verb has
as flags (``settings.in_flags``). A scan of the sources keeps ``--flags`` out of every module
that is not the command line's own. Public functions check their keywords
(``arguments.keywords_checked``) and find their arrays by dimension name
(``arguments.data_array``).
"""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

import dask.array as da
import numpy as np
import pytest
import xarray as xr

from outcore.arguments import data_array, dataset, keywords_checked
from outcore.checks import at_least, said
from outcore.errors import ArgumentError, LayoutError, OutcoreError, PlanError
from outcore.settings import add_common_options, flags_of, in_flags

SRC = Path(__file__).resolve().parents[1] / "src" / "outcore"
#: The command line's own modules: they may name flags.
CLI_PARTS = {"cli.py", "settings.py", "runner.py", "tune.py", "demo.py", "verbs.py", "verbs"}
#: Families whose modules still name flags while their Python surface is moved (issue 34).
PENDING: set[str] = set()
FLAG = re.compile(r"(?<![\w-])--[a-z]")


def _library_modules() -> list[Path]:
    out = []
    for path in sorted(SRC.rglob("*.py")):
        parts = path.relative_to(SRC).parts
        if CLI_PARTS & set(parts):
            continue
        out.append(path)
    return out


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


@pytest.mark.parametrize("path", _library_modules(), ids=lambda p: str(p.relative_to(SRC)))
def test_no_library_module_names_a_flag(path):
    """Outside the command line's modules no string (docstrings aside) names a ``--flag``:
    a Python caller is told keywords; the CLI turns them into its flags."""
    family = path.relative_to(SRC).parts[0]
    if family in PENDING:
        pytest.skip(f"outcore.{family}'s messages move to keywords with its Python surface")
    tree = ast.parse(path.read_text())
    skip = _docstrings(tree)
    found = [f"{path.name}:{node.lineno}: {node.value[:70]!r}" for node in ast.walk(tree)
             if isinstance(node, ast.Constant) and isinstance(node.value, str)
             and id(node) not in skip and FLAG.search(node.value)]
    assert not found, "\n".join(found)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    parser.add_argument("--block", type=int)
    parser.add_argument("--attr", action="append")
    parser.add_argument("--shape", nargs=3, type=int)
    parser.add_argument("--aligned", action="store_true")
    add_common_options(parser)
    return parser


@pytest.mark.parametrize(("words", "flags"), [
    ("raise memory_limit= to 2 GiB or more.", "raise --memory-limit to 2 GiB or more."),
    ("give memory_limit='334MiB' or more.", "give --memory-limit 334MiB or more."),
    ("use block=64.", "use --block 64."),
    ("use kind='local' (CPU workers)", "use --cluster local (CPU workers)"),
    ("give attrs={'energy': 12658} (eV).", "give --attr energy=12658 (eV)."),
    ("e.g. shape=(128, 128, 128).", "e.g. --shape 128 128 128."),
    ("give aligned=True.", "give --aligned."),
    ("workers=4 or more, threads_per_worker=1", "--workers 4 or more, --threads-per-worker 1"),
    ("k_y=3 and pixel_size= stay", "k_y=3 and pixel_size= stay"),  # not options of the verb
])
def test_the_command_line_names_its_flags_where_python_names_keywords(words, flags):
    error = in_flags(PlanError("The plan does not fit.", words), flags_of(_parser()))
    assert isinstance(error, PlanError)
    assert error.fix == flags


def test_checks_say_keywords_to_python_and_flags_to_the_command_line():
    with pytest.raises(OutcoreError, match=r"views=0 must be at least 1\. Fix: give views=1"):
        at_least(0, "views")
    with pytest.raises(OutcoreError, match=r"--views 0 must be at least 1\. Fix: give --views 1"):
        at_least(0, "--views")
    assert said("name", "run 1") == "name='run 1'" and said("--name") == "--name"


def _public(projections, *, block: int = 8, window: str = "ram-lak"):
    return block, window


def test_an_unknown_keyword_is_one_error_naming_it_and_its_neighbour():
    checked = keywords_checked(_public)
    assert checked(1, block=4) == (4, "ram-lak")
    with pytest.raises(ArgumentError, match=r"takes no keyword blocks=\. Fix: did you mean"
                                            r" block=\?"):
        checked(1, blocks=4)
    with pytest.raises(ArgumentError, match="missing"):
        checked(block=4)
    with pytest.raises(TypeError):  # an ArgumentError is a TypeError too
        checked(1, 2)


@pytest.mark.parametrize("chunks", [None, (2, 3, 5)])
def test_a_transposed_array_is_reordered_not_misread(chunks):
    values = np.arange(4 * 6 * 5, dtype=np.float32).reshape(4, 6, 5)
    data = values if chunks is None else da.from_array(values, chunks=chunks)
    given = xr.DataArray(data, dims=("view", "v", "u")).transpose("u", "view", "v")
    got = data_array(given, ("view", "v", "u"), "projections")
    assert got.dims == ("view", "v", "u")
    np.testing.assert_array_equal(np.asarray(got), values)
    from_dataset = data_array(xr.Dataset({"p": given, "other": xr.DataArray([1], dims="w")}),
                              ("view", "v", "u"), "projections")
    np.testing.assert_array_equal(np.asarray(from_dataset), values)


def test_arrays_without_names_or_with_other_dims_are_refused_with_the_fix():
    with pytest.raises(ArgumentError, match=r"projections= is a ndarray without dimension"
                                            r" names.*xr\.DataArray\(array, dims="):
        data_array(np.zeros((2, 3, 4)), ("view", "v", "u"), "projections")
    with pytest.raises(LayoutError, match=r"has dims \('a', 'v', 'u'\)"):
        data_array(xr.DataArray(np.zeros((2, 3, 4)), dims=("a", "v", "u")),
                   ("view", "v", "u"), "projections")
    with pytest.raises(LayoutError, match="none of its variables"):
        data_array(xr.Dataset({"x": ("w", [1.0])}), ("view", "v", "u"), "projections")
    with pytest.raises(ArgumentError, match="scan= is a list"):
        dataset([1, 2], "scan")
