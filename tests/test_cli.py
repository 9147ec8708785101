"""The outcore command: demo end to end, errors before anything is written, plan, info."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import xarray as xr

import outcore
from outcore.cli import main
from outcore.runs import load_summary

SMALL = ["--scan", "8", "16", "--frame", "32", "--fit-candidates", "300", "--tomo-size", "32",
         "--no-progress"]


def test_demo_runs_and_leaves_a_self_describing_run_directory(tmp_path, capfd):
    code = main(["demo", *SMALL, "--output-dir", str(tmp_path), "--name", "d",
                 "--measure-rounds", "2"])
    assert code == 0
    # no warning on the terminal, the worker processes' included (file descriptors are
    # captured): dask's "Sizeof calculation ... failed" probe once showed in some runs
    out, err = capfd.readouterr()
    assert "WARNING" not in err and "Sizeof" not in err, err
    run = tmp_path / "d"
    summary = load_summary(run)
    assert summary["status"] == "success" and summary["command"] == "demo"
    assert summary["cluster"]["kind"] == "local" and len(summary["cluster"]["workers"]) == 2
    assert all(w["memory_limit_bytes"] == 736 * 2**20 for w in summary["cluster"]["workers"])
    # every family's libraries loaded, a worker stays under dask's spill line (70 %), where
    # dask would warn "Unmanaged memory use is high", which the user cannot act on
    assert max(summary["metrics"]["peak_worker_rss_bytes"].values()) < 0.7 * 736 * 2**20
    assert summary["plan"]["fits"] and summary["rounds"]["measure"] == 2
    names = {o["name"] for o in summary["outputs"]}
    assert names == {"stack.zarr", "statistics.zarr", "ptycho-stack.zarr",
                     "ptycho-stack.truth.zarr", "ptycho-preprocessed.zarr"}
    assert not [p.name for p in run.iterdir() if ".partial-" in p.name]
    assert all(len(o["sha256"]) == 64 and o["bytes"] > 0 for o in summary["outputs"])
    assert (run / "dask-report.html").stat().st_size > 0
    assert "cluster" in (run / "effective-config.yaml").read_text()
    # the statistics agree with the simulation's truth within Poisson noise
    assert summary["metrics"]["tomo_fbp"]["psnr_db"] > 18  # FBP of the phantom, vs its truth
    assert summary["metrics"]["ptycho_reconstruct"]["object_error"] < 0.02  # vs its truth
    fits = summary["metrics"]["fit_dipoles"]
    assert fits["candidates"] == 300 and sum(fits["status_counts"].values()) == 300
    check = summary["metrics"]["verification"]
    assert 0.8 < check["mean_pull_std"] < 1.2 and 0.8 < check["total_pull_std"] < 1.2
    stack = outcore.open(run / "stack.zarr")["data"]
    stats = xr.open_zarr(run / "statistics.zarr", consolidated=False)
    np.testing.assert_allclose(stats["total"], stack.sum(("k_y", "k_x")), rtol=1e-6)
    assert "read-and-reduce" in out and "dashboard http://127.0.0.1:" in out
    printed = json.loads(out[out.index("{\n"):])
    assert printed["status"] == "success" and printed["run_dir"] == str(run.resolve())


def test_existing_run_directory_is_refused_before_anything(tmp_path, capsys):
    (tmp_path / "d").mkdir()
    assert main(["demo", *SMALL, "--output-dir", str(tmp_path), "--name", "d"]) == 1
    assert "already exists" in capsys.readouterr().err
    assert list((tmp_path / "d").iterdir()) == []


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--device-memory-limit", "1GiB"], "--device-memory-limit does not apply"),
        (["--cluster", "cuda"] if not outcore.backend.gpu_available() else ["--cluster", "x"],
         "cluster"),
        (["--backend", "cupy"] if not outcore.backend.gpu_available() else ["--workers", "0"],
         "cupy" if not outcore.backend.gpu_available() else "at least 1"),
        (["--memory-limit", "400MiB", "--scan", "64", "64", "--chunk-rows", "32", "--frame", "128"],
         "does not fit"),
    ],
)
def test_bad_options_fail_with_a_fix_and_write_nothing(tmp_path, capsys, extra, words):
    args = ["demo", *SMALL, "--output-dir", str(tmp_path / "runs"), "--name", "d", *extra]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert words in err and "Fix:" in err
    assert not (tmp_path / "runs" / "d").exists()


def test_plan_prints_the_table_without_running(capsys):
    assert main(["plan", "demo", "--scan", "8", "16", "--frame", "32"]) == 0
    out = capsys.readouterr().out
    assert "read-and-reduce" in out and "verdict: fits" in out
    assert main(["plan", "demo", "--frame", "128", "--chunk-rows", "64",
                 "--memory-limit", "400MiB"]) == 1
    assert "needs a limit of" in capsys.readouterr().out


def test_info_lists_versions_and_backends(capsys):
    assert main(["info"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert "numpy" in info["backends"] and info["versions"]["dask"] == "2026.7.1"


def test_convert_an_hdf5_volume_records_its_input_hash(tmp_path):
    source = tmp_path / "scan.h5"
    volume = np.random.default_rng(3).random((6, 10, 12), dtype=np.float32)
    with h5py.File(source, "w") as f:
        f["/entry/volume"] = volume
    out = tmp_path / "volume.zarr"
    code = main(["convert", str(source), str(out), "--layout", "volume", "--dataset",
                 "/entry/volume", "--attr", "voxel_size=1e-6", "--cluster", "threads",
                 "--output-dir", str(tmp_path / "runs"), "--name", "c", "--no-progress"])
    assert code == 0
    ds = outcore.open(out)
    np.testing.assert_array_equal(ds["volume"].values, volume)
    assert ds.attrs["voxel_size"] == 1e-6
    summary = load_summary(tmp_path / "runs" / "c")
    assert summary["inputs"][0]["bytes"] == source.stat().st_size
    assert summary["outputs"][0]["path"] == str(out.resolve())


def test_convert_refuses_a_wrong_dataset_before_starting(tmp_path, capsys):
    source = tmp_path / "scan.h5"
    with h5py.File(source, "w") as f:
        f["/entry/volume"] = np.zeros((2, 3, 4), np.float32)
    code = main(["convert", str(source), str(tmp_path / "v.zarr"), "--layout", "volume",
                 "--dataset", "/entry/nope", "--attr", "voxel_size=1",
                 "--output-dir", str(tmp_path / "runs")])
    assert code == 1
    assert "/entry/volume" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists() and not (tmp_path / "v.zarr").exists()


def test_the_installed_command_exits_non_zero_on_error(tmp_path):
    exe = Path(sys.executable).parent / "outcore"
    done = subprocess.run([str(exe), "demo", "--cluster", "bogus"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 1 and "Unknown cluster" in done.stderr


def test_the_command_runs_the_exit_handlers_and_keeps_the_exit_code():
    """``entry`` skips the interpreter's teardown, not the exit handlers nor the code."""
    script = ("import atexit, sys\n"
              "from outcore.cli import entry\n"
              "atexit.register(lambda: print('handler ran', flush=True))\n"
              "sys.argv = ['outcore'] + sys.argv[1:]\n"
              "entry()\n")
    for argv, code in ((["info"], 0), (["demo", "--cluster", "bogus"], 1)):
        done = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == code
        assert done.stdout.rstrip().endswith("handler ran")
