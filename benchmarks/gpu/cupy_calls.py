"""The cupy names outcore's GPU paths call, checked against the cupy the GPU machine runs.

    python benchmarks/gpu/cupy_calls.py --python VENV/bin/python   # a venv with that cupy
    python benchmarks/gpu/cupy_calls.py                             # list the calls only

Reads (never imports) ``src/outcore/backend.py`` and every ``src/outcore/*/kernels/gpu.py``
and collects each dotted name rooted at ``cupy`` or ``cupyx`` (``cupy.fft.rfft2``,
``cupyx.scipy.fft.next_fast_len``; a chain ends at its first call or subscript). With
``--python``, that interpreter resolves every name (importing the longest module prefix,
then ``getattr`` on the rest; cupy imports without a GPU) and the names that resolve are
written to ``cupy-calls.txt`` under a line naming the cupy version; the names that do not
are printed and the exit status is 1. ``tests/test_gpu_scripts.py`` fails when the sources
call a name that ``cupy-calls.txt`` does not hold, so a missing function is found here, not
on the device. The device's cupy: cupy-cuda13x 14.2.0 (the device tool's KINDS.md).
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src" / "outcore"
CHECKED = HERE / "cupy-calls.txt"
ROOTS = ("cupy", "cupyx")
#: Run by ``--python``: resolves each name given on stdin (a JSON list), prints the cupy
#: version and the names that do not resolve (JSON).
_RESOLVE = """
import importlib, json, sys
def resolves(name):
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for part in parts[cut:]:
                obj = getattr(obj, part)
        except AttributeError:
            return False
        return True
    return False
names = json.load(sys.stdin)
import cupy
print(json.dumps({"version": cupy.__version__, "missing": [n for n in names if not resolves(n)]}))
"""


def gpu_sources() -> list[Path]:
    """The files whose cupy calls are checked: backend.py and every family's kernels/gpu.py."""
    return [SRC / "backend.py", *sorted(SRC.glob("*/kernels/gpu.py"))]


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and node.id in ROOTS:
        return ".".join([node.id, *reversed(parts)])
    return None


def calls(paths: list[Path]) -> set[str]:
    """Every longest dotted name rooted at ``cupy`` or ``cupyx`` in ``paths``' code."""
    found: set[str] = set()
    for path in paths:
        tree = ast.parse(path.read_text(), filename=str(path))
        inner = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and id(node) not in inner:
                name = _dotted(node)
                if name is not None:
                    found.add(name)
    return found


def checked() -> set[str]:
    """The names ``cupy-calls.txt`` records as present in the checked cupy."""
    return {line.strip() for line in CHECKED.read_text().splitlines()
            if line.strip() and not line.startswith("#")}


def resolve(names: list[str], python: str, env: dict[str, str] | None = None
            ) -> tuple[str, list[str]]:
    """The cupy version ``python`` imports and those of ``names`` it does not have."""
    done = subprocess.run([python, "-c", _RESOLVE], input=json.dumps(names), env=env,
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"cupy_calls.py: {python} could not import cupy: "
                 f"{done.stderr.strip().splitlines()[-1:]}")
    report = json.loads(done.stdout)
    return report["version"], report["missing"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--python", default=None, help="an interpreter with the pinned cupy")
    args = p.parse_args(argv)
    names = sorted(calls(gpu_sources()))
    if args.python is None:
        print("\n".join(names))
        return 0
    version, missing = resolve(names, args.python)
    present = [n for n in names if n not in missing]
    CHECKED.write_text(f"# checked against cupy {version} by benchmarks/gpu/cupy_calls.py:"
                       " the cupy names outcore's GPU code calls\n" + "\n".join(present) + "\n")
    for name in missing:
        print(f"missing in cupy {version}: {name}")
    print(f"cupy_calls.py: {len(present)} of {len(names)} names resolve; wrote {CHECKED}")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
