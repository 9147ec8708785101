"""Logs a person can read: when stdout is not a terminal (a batch job's log), progress is a
plain line now and then, never carriage-return frames, and a run prints no warning the user
cannot act on (zarr's unstable-specification warning for fixed-width strings)."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import numpy as np

from outcore import progress
from outcore.fit import simulate_catalog


def test_a_logged_run_has_progress_lines_and_no_frames_or_warnings(tmp_path):
    catalog, _ = simulate_catalog(600, stamp=11, seed=2)
    npz = tmp_path / "stamps.npz"
    np.savez(npz, **{name: catalog[name].values for name in
                     ("images", "variance", "candidate_id")})
    done = subprocess.run(
        [sys.executable, "-m", "outcore.cli", "fit-dipoles", "--input", str(npz),
         "--chunk-size", "100", "--cluster", "local", "--workers", "1",
         "--output-dir", str(tmp_path / "runs"), "--name", "logged"],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "\r" not in done.stdout and "\r" not in done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("progress:")]
    assert lines and lines[-1].startswith("progress: ") and "(100%)" in lines[-1]
    assert "Warning" not in done.stderr, done.stderr


def test_ptycho_reconstruct_prints_no_warning(tmp_path):
    """The reconstruction's store (its ``xy`` labels are strings) and checkpoints are written
    without zarr's unstable-specification warning, or any other."""
    from outcore.ptycho import preprocess, save_preprocessed, simulate

    from .ptycho_cases import local_client

    with local_client() as client:
        stack, _ = simulate((6, 6), detector=32, seed=1).save(tmp_path / "scan.zarr")
        save_preprocessed(preprocess(stack, client=client), tmp_path / "pre.zarr")
    done = subprocess.run(
        [sys.executable, "-W", "default", "-m", "outcore.cli", "ptycho", "reconstruct",
         "--input", str(tmp_path / "pre.zarr"), "--iterations", "2", "--checkpoint-every",
         "1", "--cluster", "local", "--workers", "1", "--output-dir", str(tmp_path / "runs"),
         "--name", "ptycho"],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "runs" / "ptycho" / "reconstruction.zarr").is_dir()
    assert "Warning" not in done.stderr, done.stderr


def test_line_progress_prints_at_most_one_line_per_interval(capsys, monkeypatch):
    """The first call, then nothing until the interval passes, and always the last one."""
    bar = progress.LineProgress.__new__(progress.LineProgress)
    bar._last = -float("inf")
    bar._start_time = 0.0
    clock = iter([100.0, 101.0, 105.0, 111.0, 112.0])
    # progress's own clock only: patching time.monotonic itself would stop the event loop
    # of any client still running in this process (its thread reads the same function)
    monkeypatch.setattr(progress, "time", SimpleNamespace(monotonic=lambda: next(clock)))
    monkeypatch.setattr(progress.LineProgress, "elapsed", property(lambda self: 1.0))
    for remaining in (10, 8, 5, 3, 0):
        bar._draw_bar(remaining, 10)
    out = capsys.readouterr().out.splitlines()
    assert [line.split(" ")[1] for line in out] == ["0/10", "7/10", "10/10"]


def test_the_comms_size_probe_of_a_deep_message_is_quiet_and_other_failures_are_not(caplog):
    """A deeply nested message (a performance report's profile) makes dask's size estimate
    give up; distributed's comm asks with a default of -1 only to pick a thread, which the
    demo used to print as a warning. Other failed estimates still warn."""
    import logging
    import sys

    from distributed.sizeof import safe_sizeof

    from outcore.cluster.quiet import quiet_size_probes

    deep: dict = {}
    node = deep
    # deeper than the interpreter's recursion limit, where dask's sizeof gives up (a fixed
    # 500 was not, after test_layers had raised the limit in the same process)
    for _ in range(sys.getrecursionlimit() + 100):
        node["child"] = {}
        node = node["child"]
    quiet_size_probes()
    quiet_size_probes()  # twice adds one filter
    with caplog.at_level(logging.WARNING, logger="distributed.sizeof"):
        assert safe_sizeof(deep, default_size=-1) == -1
        assert not caplog.records
        assert safe_sizeof(deep, default_size=1e6) == 1e6
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert len(logging.getLogger("distributed.sizeof").filters) == 1
