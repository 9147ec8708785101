"""Everything the GPU machine runs imports only what that machine has or the run carries.

The H200 machine's Python holds the packages of ``benchmarks/gpu/device-packages.txt`` (read
from the device tool's KINDS.md) and the run installs the wheels of
``benchmarks/gpu/wheels.txt``; nothing else can be fetched there. So every module of
``src/outcore``, every test file (pytest collects them all) and the benchmark scripts the
GPU run starts may import, at any depth, only the standard library, outcore itself and the
distributions of those two lists. A module read here, not imported: the check needs neither
the packages nor a GPU. (astropy was missing from both once: collecting a diffim test failed
on the device.)
"""

from __future__ import annotations

import ast
import re
import sys
from importlib import metadata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
GPU = REPO / "benchmarks" / "gpu"
#: The benchmark scripts benchmarks/gpu/run.py starts, and the modules they import.
GPU_BENCHMARKS = ("bench_fit.py", "bench_tomo.py", "bench_ptycho.py", "common.py")
#: Modules of this repository that the files import by their own names.
LOCAL = {"outcore", "tests", "common", "bench_cli", "bench_real", "ptycho_cases", "raw_scan"}
#: The distribution of a module that is not installed here (the GPU extra's, the machine's).
NOT_HERE = {"cupy": "cupy-cuda13x", "cupyx": "cupy-cuda13x", "dask_cuda": "dask-cuda",
            "pynvml": "nvidia-ml-py", "cuda": "cuda-bindings", "skimage": "scikit-image"}
#: What an ``except`` must catch for the imports in its ``try`` to count as optional.
GUARDS = {"ImportError", "ModuleNotFoundError"}


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _listed(path: Path) -> set[str]:
    names = set()
    for line in path.read_text().splitlines():
        text = line.split("#")[0].strip()
        if text:
            names.add(_normal(re.split(r"[=<>!~\[ ]", text, maxsplit=1)[0]))
    return names


def _guarded(tree: ast.AST) -> set[int]:
    """The ids of the import nodes inside a ``try`` whose handlers catch an ImportError: the
    code runs on without them (a peer the benchmark reports as absent, a skip)."""
    guarded = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
                {n.id for n in ast.walk(h.type) if isinstance(n, ast.Name)} & GUARDS
                for h in node.handlers if h.type is not None):
            guarded.update(id(inner) for stmt in node.body for inner in ast.walk(stmt))
    return guarded


def _imports(path: Path) -> set[str]:
    """The top-level names of every absolute import in ``path``, at any depth of its code,
    except those a ``try ... except ImportError`` makes optional."""
    found = set()
    tree = ast.parse(path.read_text(), filename=str(path))
    optional = _guarded(tree)
    for node in ast.walk(tree):
        if id(node) in optional:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def _files() -> list[Path]:
    return [*sorted((REPO / "src" / "outcore").rglob("*.py")),
            *sorted((REPO / "tests").glob("*.py")),
            *(REPO / "benchmarks" / name for name in GPU_BENCHMARKS),
            GPU / "run.py"]


def _named_like(module: str) -> set[str]:
    """The installed distribution named as ``module``: one whose files hold no top-level
    record for importlib to map (ducc0's single extension-module file)."""
    try:
        return {_normal(metadata.distribution(module).metadata["Name"])}
    except metadata.PackageNotFoundError:
        return set()


def test_every_import_is_on_the_gpu_machine_or_among_its_wheels():
    allowed = _listed(GPU / "device-packages.txt") | _listed(GPU / "wheels.txt")
    providers = metadata.packages_distributions()
    problems = []
    for path in _files():
        for name in sorted(_imports(path) - LOCAL - set(sys.stdlib_module_names)):
            dists = ({_normal(d) for d in providers.get(name, [])}
                     or ({NOT_HERE[name]} if name in NOT_HERE else set())
                     or _named_like(name))
            if not dists:
                problems.append(f"{path.relative_to(REPO)}: {name} (no distribution here)")
            elif not dists & allowed:
                problems.append(f"{path.relative_to(REPO)}: {name} ({', '.join(sorted(dists))})")
    assert not problems, ("imports that neither the GPU machine nor benchmarks/gpu/wheels.txt"
                          " provide (add the wheel, or import it with pytest.importorskip or"
                          " inside the function that needs it):\n" + "\n".join(problems))


def test_the_check_sees_imports_inside_functions(tmp_path):
    source = tmp_path / "module.py"
    source.write_text("import os\nfrom . import sibling\n\ndef f():\n    import cupyx.scipy.fft\n"
                      "    from astropy.io import fits\n    try:\n        import astra\n"
                      "    except ImportError:\n        astra = None\n")
    assert _imports(source) == {"os", "cupyx", "astropy"}
    assert "astropy" in _listed(GPU / "wheels.txt")


@pytest.mark.parametrize("listing", ["device-packages.txt", "wheels.txt"])
def test_the_lists_name_what_the_gpu_run_relies_on(listing):
    names = _listed(GPU / listing)
    needed = {"device-packages.txt": {"cupy-cuda13x", "numpy", "numba", "h5py", "pytest"},
              "wheels.txt": {"dask", "distributed", "zarr", "dask-cuda", "sep", "astropy"}}
    assert needed[listing] <= names
