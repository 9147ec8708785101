"""benchmarks/gpu: the wheel set agrees with pyproject and the machine, the run's driver keeps
going past a failed step, and a dry run of its first steps works here (no GPU, no wheels)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import runpy
import subprocess
import sys
import sysconfig
import time
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from outcore import backend

REPO = Path(__file__).resolve().parents[1]
GPU = REPO / "benchmarks" / "gpu"


def _module(name: str):
    spec = importlib.util.spec_from_file_location(f"gpu_{name}", GPU / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


wheelset = _module("wheelset")
runner = _module("run")


def _pyproject_requirements() -> dict[str, Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    reqs = [Requirement(r) for r in project["dependencies"] + extras["gpu"] + extras["mpi"]]
    return {wheelset.normal(r.name): r for r in reqs}


def test_pins_satisfy_pyproject_and_cover_every_base_dependency():
    pins, device = wheelset.read_pins(), wheelset.read_device()
    required = _pyproject_requirements()
    pinned_here = [name for name in pins if name in required]
    assert {"dask", "distributed", "zarr", "bokeh", "dask-cuda", "dask-mpi"} <= set(pinned_here)
    for name in pinned_here:
        assert required[name].specifier.contains(pins[name], prereleases=True), name
    base = [wheelset.normal(Requirement(r).name) for r in
            tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]]
    assert [name for name in base if name not in pins and name not in device] == []
    # carried only where the machine lacks it, mpi4py aside (wheels.txt says why)
    assert sorted(set(pins) & device) == ["mpi4py"]


def _wheel(folder: Path, name: str, version: str, requires: list[str]) -> None:
    path = folder / f"{name}-{version}-py3-none-any.whl"
    meta = "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(path, "w") as whl:
        whl.writestr(f"{name}-{version}.dist-info/METADATA",
                     f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{meta}")


def test_wheelset_finds_a_missing_need_a_second_version_and_a_missing_pin(tmp_path):
    pins = {"alpha": "1.0", "beta-pkg": "2.0"}
    _wheel(tmp_path, "alpha", "1.0", ["beta_pkg>=2", "numpy", "gamma; extra == 'test'",
                                      "delta; python_version < '3.12'"])
    assert wheelset.problems(tmp_path, pins, {"numpy"}) == [
        "beta-pkg==2.0: no wheel",
        "alpha-1.0-py3-none-any.whl needs beta-pkg: neither carried nor on the machine"]
    _wheel(tmp_path, "beta_pkg", "2.0", ["epsilon"])
    _wheel(tmp_path, "beta_pkg", "2.1", [])
    found = wheelset.problems(tmp_path, pins, {"numpy"})
    assert found == ["beta-pkg: 2 wheels (2.0, 2.1); keep one",
                     "beta_pkg-2.0-py3-none-any.whl needs epsilon: neither carried nor on the "
                     "machine"]
    (tmp_path / "beta_pkg-2.1-py3-none-any.whl").unlink()
    assert wheelset.problems(tmp_path, pins, {"numpy", "epsilon"}) == []


def _context(tmp_path: Path, budget_s: float):
    out, work = tmp_path / "out", tmp_path / "work"
    out.mkdir()
    work.mkdir()
    for name in ("gpu.jsonl", "steps.log", "pytest.log"):
        (out / name).touch()
    return runner.Context(True, out, work, tmp_path / "no-wheels", time.monotonic() + budget_s)


def test_a_step_past_its_limit_is_killed_with_its_children_and_the_next_steps_run(tmp_path):
    ctx = _context(tmp_path, 60)
    pid_file = tmp_path / "child.pid"
    sleeper = (f"import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', "
               f"'import time; time.sleep(60)']); open({str(pid_file)!r}, 'w').write(str(p.pid));"
               f" print('started', flush=True); time.sleep(60)")

    def hangs(c):
        c.run([sys.executable, "-c", sleeper])
        return "never"

    def fails(c):
        if c.run([sys.executable, "-c", "import sys; sys.exit(3)"]) != 0:
            raise runner.StepFailed("exit 3")
        return "never"

    def works(c):
        c.emit({"bench": "b", "tool": "t", "case": {"n": 1}, "metric": "m", "value": 2.0})
        return "fine"

    steps = [runner.Step("hangs", 2, "sleeps", hangs), runner.Step("fails", 30, "exits 3", fails),
             runner.Step("works", 30, "a line", works)]
    t0 = time.monotonic()
    results = runner.run_steps(ctx, steps)
    assert time.monotonic() - t0 < 20
    assert [r.status for r in results] == ["timeout", "failed", "ok"]
    assert results[1].note == "exit 3" and results[2].note == "fine"
    child = int(pid_file.read_text())
    time.sleep(0.2)
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)
    log = (ctx.out / "steps.log").read_text()
    assert "[hangs] killed at the step's limit" in log and "started" in log
    assert "[fails] exit 3" in log
    table = runner.write_table(ctx, results, "now", 1.0)
    assert "not ok: hangs, fails" in table and "| works | ok |" in table
    line = json.loads((ctx.out / "gpu.jsonl").read_text())
    assert line["step"] == "works" and line["value"] == 2.0


def test_steps_left_without_time_are_not_run(tmp_path):
    ctx = _context(tmp_path, runner.RESERVE_S + runner.MIN_STEP_S - 1)
    results = runner.run_steps(ctx, [runner.Step("late", 30, "", lambda c: "ran")])
    assert results[0].status == "not run" and "budget spent" in results[0].note


def test_dry_run_of_setup_and_info_uses_this_checkout(tmp_path):
    out, wheels = tmp_path / "out", tmp_path / "wheels"
    wheels.mkdir()
    env = {**os.environ, "OUTCORE_GPU_PYTHON": sys.executable}
    done = subprocess.run([str(GPU / "run.sh"), "--dry-run", "--steps", "setup,info",
                           "--wheels", str(wheels), "--out", str(out),
                           "--work", str(tmp_path / "work")],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    steps = json.loads((out / "steps.json").read_text())["steps"]
    assert [(s["name"], s["status"]) for s in steps] == [("setup", "ok"), ("info", "ok")]
    info = json.loads((out / "info.json").read_text())
    assert info["outcore_info"]["backends"] == ["numpy"]
    assert info["outcore_from"] == str(REPO / "src" / "outcore" / "__init__.py")
    # cupy finds CUDA's libraries through site.getsitepackages(): the base's must be there
    assert sysconfig.get_paths()["purelib"] in info["site_packages"]
    script = tmp_path / "work" / "venv" / "bin" / "outcore"
    assert os.access(script, os.X_OK)
    # a cluster's worker processes re-run the script as __mp_main__: it must not run a job
    # then (a local cluster hung on the unguarded script); run as a command, it does
    spawned = subprocess.run([sys.executable, "-c", "import runpy, sys; sys.argv = ['outcore',"
                              f" '--help']; runpy.run_path({str(script)!r},"
                              " run_name='__mp_main__')"],
                             capture_output=True, text=True, timeout=60)
    assert spawned.returncode == 0 and "usage" not in spawned.stdout
    helped = subprocess.run([str(tmp_path / "work" / "venv" / "bin" / "python"), str(script),
                             "--help"], capture_output=True, text=True, timeout=60)
    assert helped.returncode == 0 and "usage" in helped.stdout
    assert sorted(p.name for p in out.iterdir()) == [
        "gpu.jsonl", "info.json", "pytest.log", "steps.json", "steps.log", "table.md"]
    again = subprocess.run([str(GPU / "run.sh"), "--dry-run", "--out", str(out)],
                           capture_output=True, text=True, env=env, timeout=60)
    assert again.returncode == 2 and "not empty" in again.stderr


def test_the_steps_run_by_value_within_the_budget():
    names = [step.name for step in runner.STEPS]
    assert names[:4] == ["setup", "info", "warm", "pytest-gpu"]
    first_bench = min(i for i, name in enumerate(names) if name.startswith("bench-"))
    assert {"cli-fit", "cli-tomo", "cli-ptycho"} <= set(names[:first_bench])
    assert all(name.startswith("bench-") for name in names[first_bench:])
    # everything up to the benchmarks fits the budget, even when each step takes its limit
    assert sum(step.limit_s for step in runner.STEPS[:first_bench]) <= runner.BUDGET_S


class _Parsed(Exception):
    """Raised once a script's options have parsed: nothing after the parse runs."""


def test_the_benchmark_steps_pass_only_options_their_scripts_accept(tmp_path, monkeypatch):
    """Each benchmark step's arguments, as the GPU run and its dry run pass them, parse (a
    step with an unknown option ends at once on the device, exit 2: --no-quantem did)."""
    calls = []
    monkeypatch.setattr(runner, "bench", lambda ctx, script, *argsets: calls.extend(
        (script, list(args)) for args in argsets) or "")
    for dry in (True, False):
        (tmp_path / str(dry)).mkdir()
        ctx = _context(tmp_path / str(dry), 100.0)
        ctx.dry = dry
        for step in runner.STEPS:
            if step.name.startswith("bench-"):
                step.run(ctx)
    assert {script for script, _ in calls} == {"bench_tomo.py", "bench_ptycho.py",
                                               "bench_fit.py"}
    parse = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        parse(self, args, namespace)  # exits 2 on an option the script does not know
        raise _Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    for script, args in calls:
        monkeypatch.setattr(sys, "argv", [script, *args])
        with pytest.raises(_Parsed):
            runpy.run_path(str(REPO / "benchmarks" / script), run_name="__main__")


def test_the_gpu_test_files_are_those_with_gpu_marks():
    files = runner.gpu_test_files()
    assert "tests/test_tomo_kernels.py" in files and "tests/test_ptycho_engine.py" in files
    assert "tests/test_mpi.py" not in files and "tests/test_gpu_scripts.py" not in files


@pytest.mark.skipif(backend.gpu_available(), reason="checks the message shown without a GPU")
@pytest.mark.parametrize("script", ["bench_fit.py", "bench_tomo.py", "bench_ptycho.py"])
def test_benchmarks_refuse_cupy_without_a_gpu_in_one_line(script, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    monkeypatch.setattr(sys, "argv", [script, "--backend", "cupy"])
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(REPO / "benchmarks" / script), run_name="__main__")
    assert done.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith(f"{script}: The cupy backend was asked for") and "Fix:" in err


cupy_calls = _module("cupy_calls")


def test_every_cupy_name_the_gpu_code_calls_was_found_in_the_device_s_cupy():
    """Names outcore's GPU code calls that were not checked against cupy-cuda13x 14.2 (the
    device's) fail here: rerun benchmarks/gpu/cupy_calls.py --python VENV/bin/python with
    that cupy installed (it imports without a GPU) and fix what it reports missing."""
    unchecked = cupy_calls.calls(cupy_calls.gpu_sources()) - cupy_calls.checked()
    assert not unchecked, sorted(unchecked)
    assert "cupyx.scipy.fft.rfft" in cupy_calls.checked()
    assert "cupy 14.2.0" in cupy_calls.CHECKED.read_text().splitlines()[0]


def test_the_cupy_check_finds_a_call_the_package_lacks(tmp_path):
    """The check itself, on a stand-in cupy: a call chain is collected whole (up to its call)
    and a name the package lacks is reported."""
    source = tmp_path / "gpu.py"
    source.write_text("def f(x):\n    import cupy\n    n = cupy.fft.next_fast_len(8)\n"
                      "    return cupy.asarray(x).sum() + cupy.fft.rfft(x)[n]\n")
    names = cupy_calls.calls([source])
    assert names == {"cupy.fft.next_fast_len", "cupy.asarray", "cupy.fft.rfft"}
    fake = tmp_path / "site" / "cupy"
    (fake / "fft").mkdir(parents=True)
    (fake / "__init__.py").write_text("__version__ = '0.0'\nfrom cupy import fft\n"
                                      "def asarray(x):\n    return x\n")
    (fake / "fft" / "__init__.py").write_text("def rfft(x):\n    return x\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    version, missing = cupy_calls.resolve(sorted(names), sys.executable, env)
    assert (version, missing) == ("0.0", ["cupy.fft.next_fast_len"])
