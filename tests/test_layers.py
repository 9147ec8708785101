"""outcore's layers: no import cycle, no module importing a higher layer, commands that
import only what they run (``outcore --help`` and ``outcore info`` import no family, nor
numba or pyarrow; a no-op ``fit-dipoles`` neither distributed, tornado, bokeh nor numba,
and no other family), and every family with the same rooms: kernels/ with cpu and gpu twins
(cupy imported nowhere else but backend), each gpu kernel with its twin test."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

import outcore
from outcore.families import FAMILIES

SRC = Path(outcore.__file__).parent
#: Families: packages with a ``cli`` module named in the family list.
FAMILY_PACKAGES = sorted({f.cli.rpartition(".")[0] for f in FAMILIES if f.cli.endswith(".cli")})
#: The core's layers, lowest first; a module may import its own layer and those below.
CORE_LAYERS: list[set[str]] = [
    {"outcore", "outcore.errors", "outcore.lazy", "outcore.families"},
    {"outcore.checks"},
    {"outcore.backend", "outcore.io", "outcore.arguments"},
    {"outcore.cluster", "outcore.plan"},
    {"outcore.runs", "outcore.progress", "outcore.reduce", "outcore.figures", "outcore.settings",
     "outcore.session"},
    {"outcore.verbs"},
    {"outcore.runner"},
]
FAMILY_RANK = len(CORE_LAYERS)
TOP = {"outcore.demo": FAMILY_RANK + 1, "outcore.tune": FAMILY_RANK + 1,
       "outcore.cli": FAMILY_RANK + 2}


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in SRC.rglob("*.py")}


def rank(module: str) -> int:
    """The layer of a module: the core's, the families', or the top."""
    if module in TOP:
        return TOP[module]
    if any(module == f or module.startswith(f + ".") for f in FAMILY_PACKAGES):
        return FAMILY_RANK
    for index, layer in enumerate(CORE_LAYERS):
        if module in layer or any(module.startswith(m + ".") for m in layer - {"outcore"}):
            return index
    raise AssertionError(f"{module} is in no layer: add it to CORE_LAYERS")


def _type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imports(module: str) -> set[str]:
    """The outcore modules ``module`` imports, at the top or inside functions (not under
    ``if TYPE_CHECKING``): ``from a import b`` names the module ``a.b`` when it is one."""
    tree = ast.parse(MODULES[module].read_text())
    found: set[str] = set()
    package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]

    def visit(node: ast.AST) -> None:
        if _type_checking(node):
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("outcore"))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]
                                + ([node.module] if node.module else []))
            if base.startswith("outcore"):
                for alias in node.names:
                    child = f"{base}.{alias.name}"
                    found.add(child if child in MODULES else base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    found.discard(module)
    return found


GRAPH = {m: imports(m) for m in MODULES}


def test_every_module_is_in_a_layer():
    for module in MODULES:
        rank(module)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_imports_a_higher_layer(module):
    higher = sorted(m for m in GRAPH[module] if rank(m) > rank(module))
    assert not higher, f"{module} (layer {rank(module)}) imports {higher}"


def test_families_import_no_command_module():
    for module, imported in GRAPH.items():
        if rank(module) == FAMILY_RANK:
            assert not imported & set(TOP), f"{module} imports {imported & set(TOP)}"


def test_no_import_cycle():
    """Tarjan's strongly connected components of the import graph are all single modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in GRAPH.get(v, ()):
            if w not in GRAPH:
                continue
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(10_000)
    try:
        for v in GRAPH:
            if v not in index:
                connect(v)
    finally:  # the process's other tests run under the usual limit
        sys.setrecursionlimit(limit)
    assert not cycles, f"import cycles: {cycles}"


@pytest.mark.parametrize("argv", [["--help"], ["info"]])
def test_help_and_info_import_no_family(argv):
    """A fresh interpreter: ``outcore --help`` / ``outcore info`` leave every family, numba
    and pyarrow out of ``sys.modules``."""
    probe = (
        "import sys\n"
        "from outcore.cli import main\n"
        "try:\n"
        f"    main({argv!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        f"heavy = [m for m in sys.modules if m in ('numba', 'pyarrow') or m.startswith("
        f"{tuple(FAMILY_PACKAGES)!r})]\n"
        "print('HEAVY', heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True).stdout
    assert "HEAVY []" in out, out.splitlines()[-1]


def test_a_no_op_job_imports_the_stack_and_nothing_more(tmp_path):
    """A fresh interpreter runs ``outcore fit-dipoles`` on 8 stamps as a user does (its
    workers threads of the process, ``auto``'s choice): the run succeeds without importing
    distributed (no Dask cluster: dask's threaded scheduler), tornado, bokeh (no dashboard),
    numba (the array code fits so few stamps) nor any other family's verbs or kernels (their
    ``layouts`` modules are the layout registry's); asked for a dashboard, the same run
    imports distributed and bokeh."""
    import numpy as np

    from outcore.fit import simulate_catalog

    catalog, _ = simulate_catalog(8, 17, seed=0)
    np.savez(tmp_path / "stamps.npz", images=catalog["images"].values,
             variance=catalog["variance"].values, candidate_id=catalog["candidate_id"].values)
    heavy = ("distributed", "tornado", "bokeh", "numba", "llvmlite")

    def loaded(*extra: str) -> dict[str, list[str]]:
        probe = (
            "import json, sys\n"
            "from outcore.cli import main\n"
            f"code = main(['fit-dipoles', '--input', 'stamps.npz', '--no-progress', *{extra!r}])\n"
            "roots = {m.split('.')[0] for m in sys.modules}\n"
            "families = sorted({m.split('.')[1] for m in sys.modules if m.startswith("
            f"{tuple(FAMILY_PACKAGES)!r}) and ('.cli' in m or '.kernels' in m"
            " or '.verbs' in m)})\n"
            f"print('LOADED', json.dumps({{'heavy': sorted(roots & set({heavy!r})),"
            " 'families': families, 'code': code}))\n"
        )
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                             check=True, cwd=tmp_path, timeout=300).stdout
        import json

        return json.loads(out.split("LOADED ")[1])

    plain = loaded()
    assert plain == {"heavy": [], "families": ["fit"], "code": 0}, plain
    asked = loaded("--dashboard")
    assert {"distributed", "bokeh"} <= set(asked["heavy"]) and asked["code"] == 0, asked


def test_a_verb_imports_only_its_family():
    """Parsing ``outcore tomo simulate`` imports the tomo family and no other."""
    probe = (
        "import sys\n"
        "from outcore.cli import build_parser\n"
        "build_parser('tomo').parse_args(['tomo', 'simulate', '--output', 'x.zarr'])\n"
        "print('LOADED', sorted({m.split('.')[1] for m in sys.modules if m.startswith("
        f"{tuple(FAMILY_PACKAGES)!r})}}))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True).stdout
    assert "LOADED ['tomo']" in out, out


# --- the rooms of a family ---------------------------------------------------------------------

#: Packages whose kernels have CPU and GPU twins (every family that computes on chunks).
KERNEL_PACKAGES = sorted(m for m in MODULES if m.endswith(".kernels")
                         and (SRC.joinpath(*m.split(".")[1:]) / "gpu.py").exists())


def _imports_cupy(module: str) -> bool:
    """Whether ``module`` imports cupy or cupyx anywhere (top level or in a function)."""
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        if any(name.split(".")[0] in ("cupy", "cupyx") for name in names):
            return True
    return False


def test_cupy_is_imported_only_in_backend_and_in_kernel_gpu_modules():
    allowed = {"outcore.backend", *(f"{k}.gpu" for k in KERNEL_PACKAGES)}
    offenders = sorted(m for m in MODULES if m not in allowed and _imports_cupy(m))
    assert not offenders, f"{offenders} import cupy: move that code into a kernels/gpu.py"


def test_every_family_that_computes_has_the_same_rooms():
    """Each family with a cli module (but convert, which only moves data) has kernels/ with
    cpu.py and gpu.py twins dispatched by backend.kernels, a memory model and its verbs."""
    for family in FAMILY_PACKAGES:
        root = SRC.joinpath(*family.split(".")[1:])
        if family == "outcore.convert":
            continue
        for room in ("cli.py", "memory.py", "kernels/__init__.py", "kernels/cpu.py",
                     "kernels/gpu.py"):
            assert (root / room).exists(), f"{family} has no {room}"
        dispatch = (root / "kernels" / "__init__.py").read_text()
        assert "backend.kernels" in dispatch or "kernels_named" in dispatch or \
            "kernels(" in dispatch, f"{family}.kernels does not dispatch with backend.kernels"


def _public_functions(path: Path) -> set[str]:
    """The public kernels of a module: its functions, and the names bound to another
    module's function (``residual = arrays.residual``), which are kernels as much."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Attribute):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return {name for name in names if not name.startswith("_") and not name.isupper()}


def _gpu_test_sources(path: Path) -> str:
    """The source of the gpu-marked tests of a test file (by decorator or a module-wide
    ``pytestmark``)."""
    tree = ast.parse(path.read_text())
    marked_module = any(isinstance(n, ast.Assign) and "pytestmark" in ast.unparse(n.targets[0])
                        and "gpu" in ast.unparse(n.value) for n in tree.body)
    sources = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
            marks = " ".join(ast.unparse(d) for d in node.decorator_list)
            if marked_module or "mark.gpu" in marks or "GPU" in marks:
                sources.append(ast.unparse(node))
    return "\n".join(sources)


@pytest.mark.parametrize("package", KERNEL_PACKAGES)
def test_every_gpu_kernel_has_a_cpu_twin_and_a_twin_test(package):
    root = SRC.joinpath(*package.split(".")[1:])
    gpu, cpu = _public_functions(root / "gpu.py"), _public_functions(root / "cpu.py")
    assert gpu <= cpu, f"{package}.gpu has no cpu twin of {sorted(gpu - cpu)}"
    family = package.split(".")[1]
    tests = Path(__file__).parent / f"test_{family}_kernels.py"
    assert tests.exists(), f"{package} has no twin tests ({tests.name})"
    # a twin test may sit beside its method's other tests (test_diffim_kernelfit.py)
    sources = "\n".join(_gpu_test_sources(path)
                        for path in sorted(tests.parent.glob(f"test_{family}_*.py")))
    untested = sorted(name for name in gpu if not re.search(rf"\b{name}\b", sources))
    assert not untested, f"no gpu-marked test in test_{family}_*.py names {untested}"
