"""mpirun -n 4 outcore ... --cluster mpi on loopback: a real job, and every rank exits cleanly."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from outcore.runs import load_summary
from tests.conftest import MPIRUN

pytestmark = pytest.mark.mpi
OUTCORE = str(Path(sys.executable).parent / "outcore")


def _mpirun(tmp_path: Path, args: list[str], timeout: float) -> tuple[dict[int, int], float]:
    """Run outcore on 4 ranks; return each rank's exit code and the wall time. Each rank's
    output goes to ``rank-N.log``; a rank that failed has its log's tail printed, which
    pytest shows with the failure (on the GPU machine, the only account of it)."""
    codes = tmp_path / "codes"
    command = (" ".join([OUTCORE, *args]) + ' >"rank-$PMI_RANK.log" 2>&1; '
               f'echo "$PMI_RANK $?" >> {codes}')
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    t0 = time.perf_counter()
    subprocess.run([MPIRUN, "-n", "4", "sh", "-c", command], timeout=timeout, env=env,
                   check=False, cwd=tmp_path)
    wall = time.perf_counter() - t0
    lines = codes.read_text().split()
    found = {int(r): int(c) for r, c in zip(lines[::2], lines[1::2], strict=True)}
    for rank, code in sorted(found.items()):
        if code != 0:
            log = (tmp_path / f"rank-{rank}.log").read_text(errors="replace")
            print(f"--- rank {rank} exited {code}; its output ends:\n{log[-3000:]}")
    return found, wall


def test_mpi_demo_runs_and_every_rank_exits_zero(tmp_path):
    args = ["demo", "--cluster", "mpi", "--interface", "lo", "--scan", "8", "32", "--frame",
            "64", "--fit-candidates", "500", "--no-progress", "--output-dir",
            str(tmp_path / "runs"), "--name", "m"]
    codes, _ = _mpirun(tmp_path, args, timeout=180)
    assert codes == {0: 0, 1: 0, 2: 0, 3: 0}
    summary = load_summary(tmp_path / "runs" / "m")
    assert summary["status"] == "success" and summary["cluster"]["kind"] == "mpi"
    assert len(summary["cluster"]["workers"]) == 2  # ranks 2 and 3
    assert 0.7 < summary["metrics"]["verification"]["total_pull_std"] < 1.3
    assert summary["metrics"]["fit_dipoles"]["status_counts"]["converged_f_tol"] > 450


def test_mpi_job_whose_command_fails_exits_non_zero_on_every_rank_quickly(tmp_path):
    codes, wall = _mpirun(tmp_path, ["demo", "--cluster", "mpi", "--interface", "lo", "--scan",
                                     "64", "64", "--chunk-rows", "32", "--frame", "128",
                                     "--memory-limit", "200MiB", "--output-dir",
                                     str(tmp_path / "runs"), "--name", "m"], timeout=120)
    assert set(codes) == {0, 1, 2, 3} and all(code != 0 for code in codes.values())
    assert wall < 30
    assert not (tmp_path / "runs" / "m").exists()


def test_mpi_fit_dipoles_and_convert_run_on_every_rank(tmp_path):
    import numpy as np

    from outcore.fit import simulate_catalog

    catalog, _ = simulate_catalog(400, seed=2)
    np.savez(tmp_path / "cat.npz", candidate_id=catalog["candidate_id"].values,
             images=catalog["images"].values, variance=catalog["variance"].values)
    common = ["--cluster", "mpi", "--interface", "lo", "--no-progress",
              "--output-dir", str(tmp_path / "runs")]
    codes, _ = _mpirun(tmp_path, ["convert", str(tmp_path / "cat.npz"),
                                  str(tmp_path / "cat.zarr"), "--name", "c", *common], 180)
    assert codes == {0: 0, 1: 0, 2: 0, 3: 0}
    (tmp_path / "codes").unlink()
    codes, _ = _mpirun(tmp_path, ["fit-dipoles", "--input", str(tmp_path / "cat.zarr"),
                                  "--chunk-size", "100", "--name", "f", *common], 180)
    assert codes == {0: 0, 1: 0, 2: 0, 3: 0}
    summary = load_summary(tmp_path / "runs" / "f")
    assert summary["status"] == "success" and summary["cluster"]["kind"] == "mpi"
    assert sum(summary["metrics"]["status_counts"].values()) == 400


def test_mpi_tomo_simulate_and_reconstruct_run_on_every_rank(tmp_path):
    common = ["--cluster", "mpi", "--interface", "lo", "--no-progress", "--memory-limit",
              "1GiB", "--output-dir", str(tmp_path / "runs")]
    codes, _ = _mpirun(tmp_path, ["tomo", "simulate", "--phantom", "shepp-logan", "--shape",
                                  "16", "32", "32", "--views", "32", "--geometry", "parallel",
                                  "--output", str(tmp_path / "proj.zarr"), "--name", "s",
                                  *common], 180)
    assert codes == {0: 0, 1: 0, 2: 0, 3: 0}
    (tmp_path / "codes").unlink()
    codes, _ = _mpirun(tmp_path, ["tomo", "reconstruct", "--input", str(tmp_path / "proj.zarr"),
                                  "--method", "fbp", "--name", "r", *common], 180)
    assert codes == {0: 0, 1: 0, 2: 0, 3: 0}
    summary = load_summary(tmp_path / "runs" / "r")
    assert summary["status"] == "success" and summary["cluster"]["kind"] == "mpi"
    # the limit given is the limit every rank's worker got, and the one planned with
    assert summary["config"]["cluster"]["memory_limit"] == "1GiB"
    assert [w["memory_limit_bytes"] for w in summary["cluster"]["workers"]] == [2**30] * 2
    assert summary["plan"]["memory_limit_bytes"] == 2**30


def test_mpi_ptycho_simulate_preprocess_reconstruct_run_on_every_rank(tmp_path):
    common = ["--cluster", "mpi", "--interface", "lo", "--no-progress", "--memory-limit",
              "1GiB", "--output-dir", str(tmp_path / "runs")]
    steps = [
        ["ptycho", "simulate", "--output", str(tmp_path / "s.zarr"), "--scan", "8", "8",
         "--detector", "32", "--step", "5", "--jitter", "1", "--name", "s"],
        ["ptycho", "preprocess", "--input", str(tmp_path / "s.zarr"), "--output",
         str(tmp_path / "p.zarr"), "--name", "p"],
        ["ptycho", "reconstruct", "--input", str(tmp_path / "p.zarr"), "--iterations", "4",
         "--batch-size", "16", "--name", "r"],
    ]
    for args in steps:
        codes, _ = _mpirun(tmp_path, [*args, *common], 180)
        assert codes == {0: 0, 1: 0, 2: 0, 3: 0}, args
        (tmp_path / "codes").unlink()
    summary = load_summary(tmp_path / "runs" / "r")
    assert summary["status"] == "success" and len(summary["cluster"]["workers"]) == 2
    assert summary["metrics"]["iterations_run"] == 4


@pytest.mark.gpu
def test_mpi_gpu_ranks_run_dask_cuda_workers_on_their_own_gpu(tmp_path):
    """On a GPU machine (gpu extra installed): worker ranks pin a GPU each and run
    dask-cuda's CUDAWorker; the run records the GPU of every worker."""
    common = ["--cluster", "mpi", "--interface", "lo", "--no-progress", "--backend", "cupy",
              "--device-memory-limit", "4GiB", "--output-dir", str(tmp_path / "runs")]
    codes, _ = _mpirun(tmp_path, ["ptycho", "simulate", "--output", str(tmp_path / "s.zarr"),
                                  "--scan", "8", "8", "--detector", "32", "--name", "s",
                                  *common], 240)
    assert codes == {0: 0, 1: 0, 2: 0, 3: 0}
    summary = load_summary(tmp_path / "runs" / "s")
    assert all(w["gpu_name"] for w in summary["cluster"]["workers"])
