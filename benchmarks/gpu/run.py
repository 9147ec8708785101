"""One prepared GPU run of outcore: set-up, ``outcore info``, the GPU tests, the MPI + dask-cuda
test, the GPU cases of every benchmark and the CLI on a dask-cuda cluster, each step under its
own time limit and all of them under one budget (``--budget-s``), so that the whole fits one
call to a GPU machine. A step that fails does not stop the others; the exit status is 1 when
any step did not end ``ok``.

    benchmarks/gpu/run.sh                 # on the GPU machine (results in $OUT)
    benchmarks/gpu/run.sh --dry-run       # here: the same steps on the CPU at tiny sizes

``run.sh`` starts this file with the machine's own Python 3 (``OUTCORE_GPU_PYTHON``, else
``python3``), which needs nothing beyond the standard library. The ``setup`` step makes a venv
from that Python that sees its packages (the machine's cupy-cuda13x, numba, numpy, ...) and
installs the wheels of ``.whl/`` into it (``benchmarks/gpu/wheels.sh`` downloads them); every
other step runs in that venv with this checkout's ``src`` first on ``PYTHONPATH``.

What comes back, in ``--out`` (at most 8 files, none in a subfolder): ``table.md`` (the steps,
the tests, the benchmark lines), ``steps.json`` (the same, for programs), ``gpu.jsonl`` (every
benchmark line, DESIGN.md's format, with the ``step`` that made it; the CLI steps add
``"path": "cli"`` lines from each run's summary), ``info.json`` (``outcore info``, package
versions, ``nvidia-smi``), ``pytest.log`` and ``steps.log`` (the last MiB of every command's
output).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
#: The whole run on the GPU machine, seconds: under 8 minutes with the machine's start.
BUDGET_S = 440.0
#: A dry run here (2 shared cores, numba compiling its kernels once): generous.
DRY_BUDGET_S = 1800.0
DRY_LIMIT_FACTOR = 4.0
#: Seconds kept back at the end for the table, and the least a step is started with.
RESERVE_S = 5.0
MIN_STEP_S = 10.0
#: Bytes of each command's output kept in the logs (the tail): some 25 commands stay well
#: under the 16 MiB a returned file may have.
LOG_TAIL_BYTES = 384 * 2**10
#: Packages whose version (and whether the venv or the machine supplied them) info.json records.
VERSIONED = ("numpy", "scipy", "numba", "pandas", "xarray", "pyarrow", "h5py", "dask",
             "distributed", "zarr", "numcodecs", "bokeh", "tornado", "cupy-cuda13x",
             "cupy-cuda12x", "dask-cuda", "rapids-dask-dependency", "cuda-core", "cuda-bindings",
             "nvidia-ml-py", "dask-mpi", "mpi4py", "mpich", "pytest", "pytest-timeout")
#: What info.json records from the venv: package versions and origins, where outcore comes
#: from, the site-packages that cupy's library search (cuda-pathfinder) reads, and whether
#: cupy compiles and runs a kernel (NVRTC), with its configuration.
_FACTS_SNIPPET = """
import contextlib, io, json, site, sys
from importlib import metadata
packages = {}
for name in sys.argv[1:]:
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        continue
    packages[name] = {"version": dist.version, "from": str(dist.locate_file(""))}
import outcore
facts = {"outcore_from": outcore.__file__, "packages": packages,
         "site_packages": site.getsitepackages()}
try:
    import cupy
    x = cupy.arange(1000, dtype=cupy.float32)
    facts["cupy_kernel_sum"] = float((x * 2).sum())
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        cupy.show_config()
    facts["cupy_config"] = text.getvalue()
except Exception as err:
    facts["cupy_error"] = f"{type(err).__name__}: {err}"
print(json.dumps(facts))
"""
#: Imports every module of outcore (printing those that fail, one a line, as JSON), so that
#: a package the machine lacks is found by name before a step needs it.
_IMPORTS_SNIPPET = """
import importlib, json, pkgutil
import outcore
failed = {}
for module in pkgutil.walk_packages(outcore.__path__, "outcore."):
    try:
        importlib.import_module(module.name)
    except Exception as err:
        failed[module.name] = f"{type(err).__name__}: {err}"
print(json.dumps(failed))
"""
#: Compiles the CPU twins' numba kernels into numba's on-disk cache (18 s on one core here,
#: 0.7 s to load after), so that no GPU test or command pays for it inside its own limit.
_WARM_SNIPPET = """
import time
t0 = time.perf_counter()
from outcore.fit.kernels import warm as fit
from outcore.ptycho.reconstruction.model import warm as ptycho
from outcore.tomo.kernels import warm as tomo
fit("numpy", "gaussian")
ptycho()
tomo("parallel")
tomo("cone")
print(round(time.perf_counter() - t0, 1))
"""
_CATALOG_SNIPPET = """
import sys
import outcore
from outcore.fit import simulate_catalog
catalog, _ = simulate_catalog(int(sys.argv[2]), seed=0, chunk_size=int(sys.argv[3]))
outcore.save(catalog, sys.argv[1])
"""


class StepFailed(Exception):
    """A step did not do what it should; the message says what went wrong."""


class StepTimedOut(StepFailed):
    """A step's command was still running when the step's time was up."""


@dataclass
class Step:
    name: str
    limit_s: float
    what: str
    run: Callable[[Context], str]


@dataclass
class Result:
    name: str
    what: str
    status: str  # ok | failed | timeout | not run
    wall_s: float
    limit_s: float
    note: str = ""


@dataclass
class Context:
    """What the steps share: where things are, the mode, the clock, what was gathered."""

    dry: bool
    out: Path
    work: Path
    wheels: Path
    deadline: float  # time.monotonic() when the whole run must end
    venv: Path = field(init=False)
    step_deadline: float = 0.0
    step: str = ""
    lines: list[dict] = field(default_factory=list)
    tests: list[dict] = field(default_factory=list)
    info: dict = field(default_factory=dict)
    _count: itertools.count = field(default_factory=itertools.count)

    def __post_init__(self) -> None:
        self.venv = self.work / "venv"

    def scratch(self, stem: str) -> Path:
        """A new file name in the scratch folder."""
        return self.work / f"{stem}-{next(self._count)}.txt"

    @property
    def python(self) -> str:
        """The python the steps after ``setup`` run with."""
        return str(self.venv / "bin" / "python")

    def env(self) -> dict[str, str]:
        path = os.environ.get("PYTHONPATH")
        return {**os.environ, "PYTHONUNBUFFERED": "1",
                "PYTHONPATH": str(REPO / "src") + (os.pathsep + path if path else ""),
                "PATH": f"{self.venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}

    def run(self, argv: list[str], log: str = "steps.log", stdout: Path | None = None) -> int:
        """Run ``argv`` in its own process group until it ends or the step's time is up (then
        the group is killed and ``StepTimedOut`` raised); its output goes to ``log`` in
        ``out`` (stdout to the file ``stdout`` instead, when given). Returns the exit code."""
        left = self.step_deadline - time.monotonic()
        if left <= 0:
            raise StepTimedOut("no time left in this step")
        combined = self.scratch("output")
        t0 = time.monotonic()
        with open(combined, "wb") as err, open(stdout or os.devnull, "wb") as std:
            proc = subprocess.Popen(argv, stdout=std if stdout else err, stderr=err, cwd=REPO,
                                    env=self.env(), start_new_session=True)
            try:
                code: int | None = proc.wait(timeout=left)
            except subprocess.TimeoutExpired:
                code = None
            finally:
                _kill_group(proc)
        wall = time.monotonic() - t0
        status = "killed at the step's limit" if code is None else f"exit {code}"
        _append_tail(self.out / log, f"[{self.step}] $ {_shown(argv)}\n", combined,
                     f"[{self.step}] {status} after {wall:.1f} s\n\n")
        if code is None:
            raise StepTimedOut(f"{_shown(argv[:4])} ... still running at the step's limit")
        return code

    def output(self, argv: list[str]) -> str:
        """Run ``argv`` like ``run`` and return its stdout; a non-zero exit fails the step."""
        path = self.scratch("stdout")
        code = self.run(argv, stdout=path)
        text = path.read_text(errors="replace")
        if code != 0:
            raise StepFailed(f"{_shown(argv[:4])} ... exited {code}")
        return text

    def emit(self, record: dict) -> None:
        """Keep one benchmark line (it goes to gpu.jsonl), tagged with this step."""
        record = {"step": self.step, **record}
        self.lines.append(record)
        with open(self.out / "gpu.jsonl", "a") as fh:
            fh.write(json.dumps(record) + "\n")


def _shown(argv: list[str]) -> str:
    return " ".join(a if a and " " not in a and "\n" not in a else repr(a) for a in argv)


def _kill_group(proc: subprocess.Popen) -> None:
    """End what is left of the command's process group (dask workers, MPI ranks): TERM, then
    KILL what is still there after 5 s; reap the command."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if not _group_alive(proc):
            break
        with contextlib.suppress(ProcessLookupError):  # it may end in between
            os.killpg(proc.pid, sig)
        end = time.monotonic() + 5.0
        while time.monotonic() < end and _group_alive(proc):
            time.sleep(0.1)
    proc.wait()


def _group_alive(proc: subprocess.Popen) -> bool:
    proc.poll()  # reap the command itself once it has ended
    try:
        os.killpg(proc.pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _append_tail(log: Path, head: str, source: Path, foot: str) -> None:
    size = source.stat().st_size
    with open(source, "rb") as fh:
        if size > LOG_TAIL_BYTES:
            fh.seek(size - LOG_TAIL_BYTES)
            head += f"[... {size - LOG_TAIL_BYTES} bytes left out ...]\n"
        body = fh.read()
    with open(log, "ab") as out:
        out.write(head.encode() + body + (b"" if body.endswith(b"\n") or not body else b"\n")
                  + foot.encode())


# --- the steps ------------------------------------------------------------------------------


def setup(ctx: Context) -> str:
    """A venv on the machine's Python that sees its packages, the wheels installed in it, and
    an ``outcore`` command beside its python (tests/test_mpi.py runs that one)."""
    if ctx.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages",
                str(ctx.venv)]) != 0:
        _fail("python -m venv failed (see steps.log)")
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    site = ctx.venv / "lib" / version / "site-packages"
    bases = dict.fromkeys([sysconfig.get_paths()[k] for k in ("purelib", "platlib")]
                          + [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))
                             and Path(p).is_dir()])
    # The machine's python may itself be a venv, whose packages --system-site-packages misses:
    # add its site-packages to sys.path, and its prefix to site.PREFIXES, so that
    # site.getsitepackages() lists them too: cupy finds CUDA's libraries (the nvidia-* wheels
    # there) through it. (site keeps this list only with --system-site-packages.)
    prefixes = dict.fromkeys([sys.prefix, sys.exec_prefix])
    (site / "outcore-gpu-base.pth").write_text(
        "import site; " + "; ".join([f"site.PREFIXES.insert(0, {p!r})" for p in prefixes]
                                    + [f"site.addsitedir({b!r})" for b in bases]) + "\n")
    script = ctx.venv / "bin" / "outcore"
    # the guard: worker processes started by spawn re-run this file as __mp_main__
    script.write_text(f"#!{ctx.python}\nimport sys\n\nfrom outcore.cli import main\n\n"
                      "if __name__ == \"__main__\":\n    sys.exit(main())\n")
    script.chmod(0o755)
    wheels = sorted(ctx.wheels.glob("*.whl"))
    if not wheels:
        if ctx.dry:
            return f"venv over {sys.executable}; no wheels in {ctx.wheels}: its own packages"
        _fail(f"no wheels in {ctx.wheels}: run benchmarks/gpu/wheels.sh here and carry .whl")
    code = ctx.run([ctx.python, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                    "--no-compile", "--no-cache-dir", "--ignore-installed",
                    "--disable-pip-version-check", *map(str, wheels)])
    if code != 0:
        _fail(f"pip install of the {len(wheels)} wheels exited {code}")
    return f"venv over {sys.executable}; {len(wheels)} wheels installed"


def info(ctx: Context) -> str:
    """``outcore info``, the versions of the packages outcore runs on, ``nvidia-smi``; every
    outcore module imports and pytest collects every test file (a missing package fails
    here, by name, not halfway through a later step)."""
    found = json.loads(ctx.output([ctx.python, "-m", "outcore.cli", "info"]))
    broken = json.loads(ctx.output([ctx.python, "-c", _IMPORTS_SNIPPET]))
    if broken:
        _fail("outcore modules that do not import: " + "; ".join(
            f"{name} ({why})" for name, why in sorted(broken.items())))
    collected = ctx.scratch("collect")
    if ctx.run([ctx.python, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q",
                "tests"], stdout=collected) != 0:
        errors = [line for line in collected.read_text(errors="replace").splitlines()
                  if line.startswith("ERROR")]
        _fail("pytest --collect-only failed: " + "; ".join(errors[:5] or ["see steps.log"]))
    facts = json.loads(ctx.output([ctx.python, "-c", _FACTS_SNIPPET, *VERSIONED]))
    smi = None
    if shutil.which("nvidia-smi"):  # for the record only: its failure fails nothing
        path = ctx.scratch("smi")
        ctx.run(["nvidia-smi", "--query-gpu=name,memory.total,memory.used,driver_version",
                 "--format=csv,noheader"], stdout=path)
        smi = path.read_text(errors="replace").strip()
    ctx.info = {"outcore_info": found, **facts, "nvidia_smi": smi, "python": sys.executable}
    (ctx.out / "info.json").write_text(json.dumps(ctx.info, indent=1) + "\n")
    gpus = found.get("gpus") or []
    note = (f"backends {'/'.join(found.get('backends', []))}, auto cluster "
            f"{found.get('auto_cluster')}, GPUs: {', '.join(g['name'] for g in gpus) or 'none'}")
    if not ctx.dry and ("cupy" not in found.get("backends", []) or not gpus
                        or found.get("auto_cluster") != "cuda"):
        _fail(f"no usable GPU for outcore: {note}")
    if not ctx.dry and facts.get("cupy_kernel_sum") != 999000.0:
        _fail(f"cupy did not compile and run a kernel: {facts.get('cupy_error')}; {note}")
    return note


def warm(ctx: Context) -> str:
    """numba's kernels of the CPU twins compiled once, into its cache, before the tests."""
    seconds = ctx.output([ctx.python, "-c", _WARM_SNIPPET]).strip()
    return f"numba kernels compiled or loaded in {seconds} s"


def gpu_test_files() -> list[str]:
    """The test files that hold GPU-marked tests, tests/test_mpi.py aside (its own step)."""
    return sorted(str(p.relative_to(REPO)) for p in (REPO / "tests").glob("test_*.py")
                  if "pytest.mark.gpu" in p.read_text() and p.name != "test_mpi.py")


def pytest_gpu(ctx: Context, files: list[str], tag: str, test_limit_s: int) -> str:
    """``pytest -m gpu`` over ``files``, each test under ``test_limit_s`` (less than the
    step's limit, so that a hung test ends and the others still report); on the GPU machine
    a skipped test fails the step."""
    junit = ctx.work / f"junit-{tag}.xml"
    code = ctx.run([ctx.python, "-m", "pytest", "-p", "no:cacheprovider", "-m", "gpu", "-v",
                    "-rfEs", "--timeout", str(test_limit_s), "--junitxml", str(junit), *files],
                   log="pytest.log")
    cases = read_junit(junit) if junit.exists() else []
    ctx.tests.extend({"step": ctx.step, **c} for c in cases)
    counts = {k: sum(c["outcome"] == k for c in cases) for k in ("passed", "failed", "skipped")}
    note = ", ".join(f"{v} {k}" for k, v in counts.items())
    if code != 0:
        _fail(f"pytest exited {code}: {note}")
    if not cases:
        _fail("no GPU test was collected")
    if not ctx.dry and counts["skipped"]:
        _fail(f"{note}: a GPU test skipped on the GPU machine")
    return note


def read_junit(path: Path) -> list[dict]:
    """One record per test case of a junit XML file: name, outcome, seconds, message."""
    out = []
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = "skipped" if child.tag == "skipped" else "failed"
                message = (child.get("message") or "").splitlines()[0][:200] \
                    if child.get("message") else ""
        out.append({"test": f"{case.get('classname', '')}::{case.get('name', '')}",
                    "outcome": outcome, "time_s": round(float(case.get("time") or 0), 2),
                    "message": message})
    return out


def bench(ctx: Context, script: str, *runs: list[str]) -> str:
    """``benchmarks/<script>`` once per argument list; its JSON lines go to gpu.jsonl."""
    count, nulls = 0, 0
    for args in runs:
        stdout = ctx.scratch("bench")
        try:
            code = ctx.run([ctx.python, str(REPO / "benchmarks" / script), *args],
                           stdout=stdout)
        except StepTimedOut as err:
            raise StepTimedOut(f"{script}: {err} (after {count + _keep(ctx, stdout)[0]} "
                               "lines, kept)") from err
        kept, null = _keep(ctx, stdout)
        count, nulls = count + kept, nulls + null
        if code != 0:
            _fail(f"{script} {' '.join(args[:2])} ... exited {code} after {count} lines")
    if not count:
        _fail(f"{script} printed no benchmark line")
    return f"{count} lines" + (f", {nulls} without a value" if nulls else "")


def _keep(ctx: Context, stdout: Path) -> tuple[int, int]:
    """Emit the JSON lines a benchmark printed (a run cut at its limit too): (lines, nulls)."""
    count = nulls = 0
    for text in stdout.read_text(errors="replace").splitlines() if stdout.exists() else []:
        try:
            record = json.loads(text) if text.startswith("{") else None
        except ValueError:  # a line cut short when the run was killed
            record = None
        if record is not None:
            ctx.emit(record)
            count += 1
            nulls += record.get("value") is None
    return count, nulls


def cli(ctx: Context, *commands: tuple[str, list[str]]) -> str:
    """outcore commands, whole processes, one after the other (a failure stops the chain);
    each run's summary becomes a ``"path": "cli"`` line."""
    runs = ctx.work / "runs"
    cluster = (["--cluster", "local", "--workers", "1", "--memory-limit", "1GiB", "--backend",
                "numpy"] if ctx.dry else ["--cluster", "cuda", "--backend", "cupy"])
    walls = []
    for name, args in commands:
        argv = [ctx.python, "-m", "outcore.cli", *args, *cluster, "--no-progress",
                "--output-dir", str(runs), "--name", name]
        t0 = time.monotonic()
        code = ctx.run(argv)
        wall = time.monotonic() - t0
        path = runs / name / "summary.json"
        summary = json.loads(path.read_text()) if path.exists() else {}
        workers = (summary.get("cluster") or {}).get("workers") or []
        ctx.emit({"bench": "cli", "tool": "outcore", "path": "cli",
                  "case": {"command": name, "argv": args + cluster},
                  "metric": "wall_s", "value": round(wall, 3), "runs": 1,
                  "median_s": round(wall, 3), "min_s": round(wall, 3), "max_s": round(wall, 3),
                  "status": summary.get("status"), "timings_s": summary.get("timings_s"),
                  "metrics": summary.get("metrics"),
                  "cluster": {"kind": (summary.get("cluster") or {}).get("kind"),
                              "gpus": [w.get("gpu_name") for w in workers]},
                  "machine": {"cpus": os.cpu_count(), "gpu": _gpu_name(ctx)},
                  "versions": summary.get("versions")})
        walls.append(f"{name} {wall:.1f} s")
        if code != 0 or summary.get("status") != "success":
            _fail(f"{name} exited {code}, status {summary.get('status')!r}")
    return ", ".join(walls)


def _gpu_name(ctx: Context) -> str | None:
    gpus = ctx.info.get("outcore_info", {}).get("gpus") or []
    return gpus[0]["name"] if gpus else None


def _fail(note: str) -> None:
    raise StepFailed(note)


def make_catalog(ctx: Context, path: Path, n: int, chunk: int) -> None:
    if ctx.run([ctx.python, "-c", _CATALOG_SNIPPET, str(path), str(n), str(chunk)]) != 0:
        _fail("could not write the catalog for fit-dipoles")


def cli_fit(ctx: Context) -> str:
    n, chunk = (2000, 500) if ctx.dry else (131_072, 16384)
    store = ctx.work / "catalog.zarr"
    make_catalog(ctx, store, n, chunk)
    return cli(ctx, ("fit-dipoles", ["fit-dipoles", "--input", str(store), "--chunk-size",
                                     str(chunk)]))


def cli_tomo(ctx: Context) -> str:
    n, views = ("16", "12") if ctx.dry else ("128", "180")
    store = str(ctx.work / "projections.zarr")
    return cli(ctx,
               ("tomo-simulate", ["tomo", "simulate", "--phantom", "shepp-logan", "--shape",
                                  n, n, n, "--views", views, "--output", store]),
               ("tomo-sirt", ["tomo", "reconstruct", "--input", store, "--method", "sirt",
                              "--iterations", "10"]))


def cli_ptycho(ctx: Context) -> str:
    scan, k, iterations = ("6", "32", "2") if ctx.dry else ("32", "64", "20")
    raw, pre = str(ctx.work / "scan.zarr"), str(ctx.work / "preprocessed.zarr")
    return cli(ctx,
               ("ptycho-simulate", ["ptycho", "simulate", "--output", raw, "--scan", scan, scan,
                                    "--detector", k, "--jitter", "1"]),
               ("ptycho-preprocess", ["ptycho", "preprocess", "--input", raw, "--output", pre]),
               ("ptycho-reconstruct", ["ptycho", "reconstruct", "--input", pre, "--iterations",
                                       iterations, "--batch-size", "16" if ctx.dry else "128",
                                       "--truth", str(ctx.work / "scan.truth.zarr")]),
               ("sketch-svd", ["sketch", "svd", "--input", raw, "--rank", "8", "--center",
                               "--denoise"]))


def bench_tomo(ctx: Context) -> str:
    if ctx.dry:
        return bench(ctx, "bench_tomo.py", [
            "--backend", "numpy", "--n", "16", "--views", "12", "--workers", "1", "--runs", "1",
            "--tools", "kernel", "outcore"])
    return bench(ctx, "bench_tomo.py", [
        "--backend", "cupy", "--n", "128", "256", "--views", "360", "--workers", "1", "--runs",
        "3", "--tools", "kernel", "outcore", "--memory-limit", "16GiB"])


def bench_ptycho(ctx: Context) -> str:
    common = ["--workers", "1", "--worker-malloc", "outcore", "--tools", "outcore"]
    if ctx.dry:
        return bench(ctx, "bench_ptycho.py", [
            "--backend", "numpy", "--scan", "6", "--k", "32", "--batch", "16", "--sub-batch",
            "8", "--iterations", "2", "--residency", "device", *common])
    # the README's size in all three residencies, then a bigger one resident on the device
    return bench(ctx, "bench_ptycho.py",
                 ["--backend", "cupy", "--iterations", "5", "--memory-limit", "16GiB", *common],
                 ["--backend", "cupy", "--scan", "64", "--k", "128", "--step", "16", "--batch",
                  "512", "--sub-batch", "256", "--iterations", "5", "--residency", "device",
                  "--memory-limit", "16GiB", *common])


def bench_fit(ctx: Context) -> str:
    if ctx.dry:
        return bench(ctx, "bench_fit.py", [
            "--backend", "numpy", "--n", "2000", "--chunk", "500", "--workers", "1", "--runs",
            "1", "--skip-scipy", "--no-cuphoton"])
    return bench(ctx, "bench_fit.py", [
        "--backend", "cupy", "--n", "131072", "--chunk", "16384", "65536", "--workers", "1",
        "--runs", "3", "--skip-scipy", "--no-cuphoton"])


def bench_cpu(ctx: Context) -> str:
    """The same machine's CPUs on numpy, for GPU-over-CPU ratios from one run."""
    cpus = str(os.cpu_count() or 1)
    if ctx.dry:
        return bench(ctx, "bench_fit.py", ["--backend", "numpy", "--n", "1000", "--chunk",
                                           "500", "--workers", "1", "--runs", "1",
                                           "--skip-scipy", "--no-cuphoton"])
    return bench(ctx, "bench_fit.py", ["--backend", "numpy", "--n", "131072", "--chunk",
                                       "4096", "--workers", cpus, "--runs", "1", "--skip-scipy",
                                       "--no-cuphoton"]) + "; " + \
        bench(ctx, "bench_tomo.py", ["--backend", "numpy", "--n", "128", "--views", "360",
                                     "--geometry", "parallel", "--workers", cpus, "--runs", "1",
                                     "--tools", "kernel", "outcore", "--memory-limit", "4GiB"])


#: The steps by value: the GPU twin tests first, then one ``--cluster cuda`` command chain
#: per family, the MPI ranks on GPUs, then the benchmarks. The limits up to the benchmarks add
#: up to ``BUDGET_S`` at most (tests/test_gpu_scripts.py checks it), so a run that meets no
#: hang does all of them, and the rest of a 15-minute lease is left for a rerun of the failed
#: steps alone (``--steps``); the benchmarks run on whatever the budget has left.
STEPS: tuple[Step, ...] = (
    Step("setup", 45, "venv over the machine's python, the .whl wheels installed", setup),
    Step("info", 45, "outcore info, package versions, nvidia-smi; every module imports and "
         "every test file collects", info),
    Step("warm", 30, "numba's CPU kernels compiled into its cache (the twins' references)",
         warm),
    Step("pytest-gpu", 110, "pytest -m gpu: every family's kernel twins, cupy projector, "
         "ptycho engine on cupy", lambda ctx: pytest_gpu(ctx, gpu_test_files(), "gpu", 75)),
    Step("cli-fit", 35, "outcore fit-dipoles on --cluster cuda, 2^17 stamps", cli_fit),
    Step("cli-tomo", 45, "outcore tomo simulate + reconstruct (SIRT) on --cluster cuda",
         cli_tomo),
    Step("cli-ptycho", 70, "outcore ptycho simulate, preprocess, reconstruct and sketch svd of "
         "the scan on --cluster cuda", cli_ptycho),
    Step("pytest-mpi-gpu", 60, "pytest -m gpu tests/test_mpi.py: mpirun ranks as dask-cuda "
         "workers", lambda ctx: pytest_gpu(ctx, ["tests/test_mpi.py"], "mpi", 50)),
    Step("bench-tomo", 60, "bench_tomo.py --backend cupy: kernels and Projector, 128^3 and "
         "256^3, 360 views", bench_tomo),
    Step("bench-fit", 45, "bench_fit.py --backend cupy: 2^17 stamps, chunks 16384 and 65536",
         bench_fit),
    Step("bench-ptycho", 60, "bench_ptycho.py --backend cupy: 32x32 of 64^2 (3 residencies), "
         "64x64 of 128^2", bench_ptycho),
    Step("bench-cpu", 50, "the same machine's CPUs: bench_fit and bench_tomo on numpy",
         bench_cpu),
)


# --- the run ----------------------------------------------------------------------------------


def run_steps(ctx: Context, steps: tuple[Step, ...] | list[Step],
              factor: float = 1.0) -> list[Result]:
    """Each step in turn under ``min(its limit, what is left of the budget)``; a step that
    fails is recorded and the next one runs."""
    results = []
    for step in steps:
        limit = step.limit_s * factor
        left = ctx.deadline - RESERVE_S - time.monotonic()
        if left < MIN_STEP_S:
            results.append(Result(step.name, step.what, "not run", 0.0, limit,
                                  f"budget spent ({max(left, 0):.0f} s left)"))
            continue
        ctx.step, ctx.step_deadline = step.name, time.monotonic() + min(limit, left)
        t0 = time.monotonic()
        try:
            status, note = "ok", step.run(ctx)
        except StepTimedOut as err:
            status, note = "timeout", str(err)
        except StepFailed as err:
            status, note = "failed", str(err)
        except Exception as err:  # a bug in a step: recorded, the next step still runs
            status, note = "failed", f"{type(err).__name__}: {err}"
        results.append(Result(step.name, step.what, status, round(time.monotonic() - t0, 1),
                              round(min(limit, left), 1), note))
        print(f"[{step.name}] {status} in {results[-1].wall_s} s: {note}", flush=True)
    return results


def write_table(ctx: Context, results: list[Result], started: str, wall_s: float) -> str:
    """table.md: the steps, the tests, the benchmark lines."""
    failed = [r.name for r in results if r.status != "ok"]
    mode = "dry run on the CPU (GPU steps on numpy, GPU tests skipped)" if ctx.dry else "GPU run"
    head = [f"# outcore {mode}: {'all steps ok' if not failed else 'not ok: ' + ', '.join(failed)}",
            "", f"{started} · GPU: {_gpu_name(ctx) or 'none'} · {os.cpu_count()} CPUs · "
            f"{wall_s:.0f} s in all", "",
            "| step | status | wall s | limit s | what | note |",
            "| --- | --- | --- | --- | --- | --- |"]
    rows = [f"| {r.name} | {r.status} | {r.wall_s} | {r.limit_s} | {r.what} | "
            f"{_cell(r.note)} |" for r in results]
    tests = ["", "## Tests", "", "| test | outcome | s | message |", "| --- | --- | --- | --- |"]
    tests += [f"| {t['test']} | {t['outcome']} | {t['time_s']} | {_cell(t['message'])} |"
              for t in ctx.tests]
    lines = ["", "## Benchmark lines (gpu.jsonl)", "",
             "| step | bench | tool | case | metric | value | median s |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {r.get('step')} | {r.get('bench')} | {r.get('tool')} | "
              f"{_cell(_case(r.get('case') or {}))} | {r.get('metric')} | {r.get('value')} | "
              f"{r.get('median_s', '')} |" for r in ctx.lines]
    text = "\n".join(head + rows + tests + lines) + "\n"
    (ctx.out / "table.md").write_text(text)
    return text


def _case(case: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in case.items() if k != "argv")


def _cell(text: str) -> str:
    return str(text).replace("|", "/").replace("\n", " ")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/gpu/run.sh",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true",
                        help="run every step here on the CPU: numpy at tiny sizes")
    parser.add_argument("--out", default=os.environ.get("OUT"),
                        help="where the results go (default $OUT; a dry run: a new temp dir)")
    parser.add_argument("--work", default=None,
                        help="scratch folder (default: a new temp dir, removed at the end)")
    parser.add_argument("--wheels", default=str(REPO / ".whl"), help="the wheels to install")
    parser.add_argument("--budget-s", type=float, default=None,
                        help=f"seconds for the whole run (default {BUDGET_S:.0f}; dry run "
                             f"{DRY_BUDGET_S:.0f})")
    parser.add_argument("--steps", default=None,
                        help=f"comma-separated subset of: {','.join(s.name for s in STEPS)}")
    args = parser.parse_args(argv)
    names = [s.name for s in STEPS]
    chosen = args.steps.split(",") if args.steps else names
    unknown = [n for n in chosen if n not in names]
    if unknown:
        parser.error(f"unknown step {', '.join(unknown)}; the steps are {', '.join(names)}")
    if args.out is None and not args.dry_run:
        parser.error("no --out and no $OUT: say where the results go")
    out = Path(args.out or tempfile.mkdtemp(prefix="outcore-gpu-out-"))
    if out.exists() and any(out.iterdir()):
        parser.error(f"{out} is not empty; results never overwrite: give an empty or new one")
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work or tempfile.mkdtemp(prefix="outcore-gpu-work-"))
    work.mkdir(parents=True, exist_ok=True)
    budget = args.budget_s or (DRY_BUDGET_S if args.dry_run else BUDGET_S)
    started = time.strftime("%Y-%m-%dT%H:%M:%S")
    t0 = time.monotonic()
    ctx = Context(args.dry_run, out, work, Path(args.wheels), t0 + budget)
    for name in ("gpu.jsonl", "steps.log", "pytest.log"):
        (out / name).touch()
    steps = [s for s in STEPS if s.name in chosen]
    results = run_steps(ctx, steps, DRY_LIMIT_FACTOR if args.dry_run else 1.0)
    wall = time.monotonic() - t0
    (out / "steps.json").write_text(json.dumps(
        {"started": started, "dry_run": args.dry_run, "budget_s": budget, "wall_s": round(wall, 1),
         "steps": [r.__dict__ for r in results], "tests": ctx.tests}, indent=1) + "\n")
    table = write_table(ctx, results, started, wall)
    print(table.split("\n## ")[0] + f"results in {out} (table.md: the tests and benchmark "
          "lines too)", flush=True)
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if all(r.status == "ok" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
