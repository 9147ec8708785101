"""deploy/: the Slurm and PBS batch scripts, run for real against a stub scheduler on loopback.

A temporary directory first on PATH holds stub ``srun`` / ``scontrol`` (Slurm) and ``mpiexec``
(PBS) that record how the script called them and run the step with the ``mpirun`` of the
``mpi`` extra (4 ranks: scheduler, client, 2 workers). Each rank is wrapped so that it writes
its exit code, as in tests/test_mpi.py. The environment holds what the scheduler would set.
"""

from __future__ import annotations

import os
import py_compile
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from outcore.runs import load_summary
from tests.conftest import MPIRUN

ROOT = Path(__file__).resolve().parents[1]
SLURM = ROOT / "deploy" / "slurm-dask-mpi.sh"
PBS = ROOT / "deploy" / "pbs-dask-mpi.sh"
JOBQUEUE = ROOT / "deploy" / "jobqueue_slurm.py"
DEMO = "demo --scan 8 16 --frame 32 --fit-candidates 100 --no-progress"
#: A demo whose plan does not fit 400 MiB workers: it fails once the cluster runs.
TOO_BIG = "demo --scan 64 64 --chunk-rows 32 --frame 128 --no-progress"

# Each rank runs under sh, which appends "RANK CODE" to the codes file and exits with CODE.
_RANK = '"$@"; code=$?; echo "$PMI_RANK $code" >> {codes}; exit $code'

STUB_SRUN = """#!/bin/sh
# stub srun: records its options and host file, runs the step with mpirun on loopback
printf '%s\\n' "$@" > {log}/srun.args
n=$SLURM_NTASKS
while [ $# -gt 0 ]; do
    case "$1" in
        --ntasks=*) n=${{1#--ntasks=}}; shift ;;
        -*) shift ;;
        *) break ;;
    esac
done
[ -z "${{SLURM_HOSTFILE:-}}" ] || cp "$SLURM_HOSTFILE" {log}/srun.hosts
exec {mpirun} -n "$n" sh -c '{rank}' rank "$@"
"""

STUB_SCONTROL = """#!/bin/sh
# stub scontrol: only `scontrol show hostnames LIST` (a comma-separated list, no ranges)
[ "$1 $2" = "show hostnames" ] || exit 1
echo "$3" | tr ',' '\\n'
"""

STUB_MPIEXEC = """#!/bin/sh
# stub mpiexec: records its options and host file, runs the ranks with mpirun on loopback
printf '%s\\n' "$@" > {log}/mpiexec.args
n=""; hosts=""
while [ $# -gt 0 ]; do
    case "$1" in
        -n|-np) n=$2; shift 2 ;;
        -f|-hostfile|--hostfile|-machinefile) hosts=$2; shift 2 ;;
        -*) echo "stub mpiexec: unexpected option $1" >&2; exit 90 ;;
        *) break ;;
    esac
done
[ -n "$hosts" ] || {{ echo "stub mpiexec: no host file" >&2; exit 91; }}
cp "$hosts" {log}/mpiexec.hosts
[ "$n" -le "$(wc -l < "$hosts")" ] || {{ echo "stub mpiexec: -n $n > host file" >&2; exit 92; }}
exec {mpirun} -n "$n" sh -c '{rank}' rank "$@"
"""


def _stubs(tmp_path: Path) -> Path:
    """A directory of stub scheduler commands; they log into tmp_path/log."""
    stubs, log = tmp_path / "stubs", tmp_path / "log"
    stubs.mkdir()
    log.mkdir()
    rank = _RANK.format(codes=log / "codes")
    for name, text in (("srun", STUB_SRUN), ("scontrol", STUB_SCONTROL),
                       ("mpiexec", STUB_MPIEXEC)):
        path = stubs / name
        path.write_text(text.format(log=log, mpirun=MPIRUN, rank=rank))
        path.chmod(0o755)
    return stubs


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The caller's environment without scheduler or OUTCORE_ variables, stubs first on PATH."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "PBS_", "OUTCORE_", "VIRTUAL_ENV"))}
    venv = Path(sys.prefix)
    has_activate = (venv / "bin" / "activate").exists()
    path = [str(_stubs(tmp_path))]
    if not has_activate:  # not a venv: outcore from this interpreter's bin on PATH
        path.append(str(Path(sys.executable).parent))
    env.update(
        PATH=os.pathsep.join([*path, env.get("PATH", "")]),
        TMPDIR=str(tmp_path),
        OUTCORE_VENV=str(venv) if has_activate else "",
        OUTCORE_INTERFACE="lo",
        OUTCORE_DASHBOARD="127.0.0.1:0",
        OUTCORE_COMMAND="demo",
        OUTCORE_ARGS=DEMO.removeprefix("demo "),
    )
    env.update(extra)
    return env


def _slurm_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return _env(tmp_path, SLURM_JOB_ID="4242", SLURM_JOBID="4242", SLURM_NTASKS="4",
                SLURM_NNODES="1", SLURM_JOB_NUM_NODES="1", SLURM_JOB_NODELIST="localhost",
                SLURM_SUBMIT_DIR=str(tmp_path), SLURM_JOB_NAME="outcore", **extra)


def _pbs_env(tmp_path: Path, nodefile_lines: int, **extra: str) -> dict[str, str]:
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("localhost\n" * nodefile_lines)
    return _env(tmp_path, PBS_JOBID="777.pbs-server", PBS_NODEFILE=str(nodefile),
                PBS_O_WORKDIR=str(tmp_path), PBS_JOBNAME="outcore", PBS_ENVIRONMENT="PBS_BATCH",
                **extra)


def _run(script: Path, env: dict[str, str], tmp_path: Path, *args: str,
         timeout: float = 120) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.perf_counter()
    proc = subprocess.run(["bash", str(script), *args], env=env, cwd=tmp_path, timeout=timeout,
                          capture_output=True, text=True, check=False)
    return proc, time.perf_counter() - t0


def _codes(tmp_path: Path) -> dict[int, int]:
    lines = (tmp_path / "log" / "codes").read_text().split()
    return {int(r): int(c) for r, c in zip(lines[::2], lines[1::2], strict=True)}


def _run_dir(proc: subprocess.CompletedProcess) -> Path:
    match = re.search(r"^outcore-job: run directory: (.+)$", proc.stdout, re.MULTILINE)
    assert match, proc.stdout
    return Path(match.group(1))


def _assert_success(proc: subprocess.CompletedProcess, tmp_path: Path, expected: Path) -> dict:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert _run_dir(proc) == expected
    summary = load_summary(expected)
    assert summary["status"] == "success"
    assert summary["cluster"]["kind"] == "mpi"
    assert len(summary["cluster"]["workers"]) == 2  # 4 ranks: scheduler, client, 2 workers
    assert _codes(tmp_path) == {0: 0, 1: 0, 2: 0, 3: 0}
    assert "outcore-job: status success, 2 workers" in proc.stdout
    return summary


def _assert_failed_quickly(proc: subprocess.CompletedProcess, wall: float, tmp_path: Path) -> None:
    assert proc.returncode != 0, proc.stdout[-3000:]
    assert wall < 30
    codes = _codes(tmp_path)
    assert set(codes) == {0, 1, 2, 3} and all(code != 0 for code in codes.values())
    assert "The plan does not fit" in proc.stdout + proc.stderr
    assert not _run_dir(proc).exists()


@pytest.mark.mpi
def test_slurm_script_places_ranks_by_gpu_and_every_rank_exits_zero(tmp_path):
    # 1 node with 2 GPUs: the script writes a host file of 2 + 2 ranks and runs them all.
    env = _slurm_env(tmp_path, SLURM_GPUS_ON_NODE="2", OUTCORE_MEMORY_LIMIT="1GiB")
    proc, _ = _run(SLURM, env, tmp_path)
    summary = _assert_success(proc, tmp_path, tmp_path / "runs" / "demo-4242")
    assert all(w["memory_limit_bytes"] == 2**30 for w in summary["cluster"]["workers"])
    srun_args = (tmp_path / "log" / "srun.args").read_text().split("\n")
    assert srun_args[:2] == ["--mpi=pmi2", "--kill-on-bad-exit=1"]
    assert "--distribution=arbitrary" in srun_args and "--ntasks=4" in srun_args
    assert (tmp_path / "log" / "srun.hosts").read_text() == "localhost\n" * 4
    assert not list(tmp_path.glob("outcore-hosts.*"))  # its temporary host file is removed


@pytest.mark.mpi
def test_slurm_script_with_a_failing_command_exits_non_zero_on_every_rank(tmp_path):
    # The command as script arguments; no GPU count, so srun runs SLURM_NTASKS ranks.
    env = _slurm_env(tmp_path, OUTCORE_MEMORY_LIMIT="400MiB", OUTCORE_SRUN_MPI="pmix")
    proc, wall = _run(SLURM, env, tmp_path, *TOO_BIG.split(), timeout=60)
    _assert_failed_quickly(proc, wall, tmp_path)
    srun_args = (tmp_path / "log" / "srun.args").read_text().split("\n")
    assert srun_args[0] == "--mpi=pmix" and "--distribution=arbitrary" not in srun_args


@pytest.mark.mpi
def test_pbs_script_runs_on_the_node_file_and_every_rank_exits_zero(tmp_path):
    env = _pbs_env(tmp_path, 4, OUTCORE_MEMORY_LIMIT="1GiB")
    proc, _ = _run(PBS, env, tmp_path)
    _assert_success(proc, tmp_path, tmp_path / "runs" / "demo-777")
    args = (tmp_path / "log" / "mpiexec.args").read_text().split("\n")
    assert args[:4] == ["-n", "4", "-hostfile", str(tmp_path / "nodefile")]


@pytest.mark.mpi
def test_pbs_script_with_a_failing_command_exits_non_zero_on_every_rank(tmp_path):
    # Torque style: 6 slots on the node, OUTCORE_GPUS_PER_NODE=2 makes a host file of 4 ranks.
    env = _pbs_env(tmp_path, 6, OUTCORE_MEMORY_LIMIT="400MiB", OUTCORE_GPUS_PER_NODE="2",
                   OUTCORE_ARGS=TOO_BIG.removeprefix("demo "))
    proc, wall = _run(PBS, env, tmp_path, timeout=60)
    _assert_failed_quickly(proc, wall, tmp_path)
    assert (tmp_path / "log" / "mpiexec.hosts").read_text() == "localhost\n" * 4


@pytest.mark.parametrize("script", [SLURM, PBS], ids=["slurm", "pbs"])
def test_scripts_parse_and_refuse_to_run_outside_a_job(tmp_path, script):
    assert subprocess.run(["bash", "-n", str(script)], check=False).returncode == 0
    env = _env(tmp_path)
    proc, _ = _run(script, env, tmp_path, timeout=30)
    assert proc.returncode != 0 and "not inside a" in proc.stderr
    assert not (tmp_path / "log" / "codes").exists()


def test_slurm_script_refuses_an_existing_run_directory_before_launching(tmp_path):
    (tmp_path / "runs" / "demo-4242").mkdir(parents=True)
    proc, _ = _run(SLURM, _slurm_env(tmp_path), tmp_path, timeout=30)
    assert proc.returncode == 2 and "already exists" in proc.stderr
    assert not (tmp_path / "log" / "srun.args").exists()


def test_jobqueue_example_compiles_and_names_its_missing_dependency(tmp_path):
    py_compile.compile(str(JOBQUEUE), cfile=str(tmp_path / "jq.pyc"), doraise=True)
    try:
        import dask_jobqueue  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("dask-jobqueue is installed: the example would submit jobs")
    proc = subprocess.run([sys.executable, str(JOBQUEUE), "--", *DEMO.split()],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2 and "pip install dask-jobqueue" in proc.stderr
