"""A scheduler that goes away ends the command with status failed and a reason, in bounded time."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent


def _wait_for(path: Path, timeout: float) -> str:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if path.exists() and path.read_text().strip():
            return path.read_text()
        time.sleep(0.2)
    raise TimeoutError(path)


def test_scheduler_loss_fails_the_run_with_a_reason(tmp_path):
    scheduler_file = tmp_path / "scheduler.json"
    scheduler = subprocess.Popen(
        [str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port", "0",
         "--dashboard-address", "127.0.0.1:0", "--scheduler-file", str(scheduler_file)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    worker = None
    try:
        address = json.loads(_wait_for(scheduler_file, 60))["address"]
        worker = subprocess.Popen(
            [str(BIN / "dask"), "worker", address, "--nthreads", "1", "--memory-limit",
             "600MiB", "--host", "127.0.0.1", "--no-dashboard"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        command = subprocess.Popen(
            [str(BIN / "outcore"), "demo", "--cluster", address, "--scan", "64", "64",
             "--frame", "128", "--chunk-rows", "1", "--fit-candidates", "0", "--no-progress",
             "--output-dir", str(tmp_path / "runs"), "--name", "r"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        summary = tmp_path / "runs" / "r" / "summary.json"
        _wait_for(summary, 120)
        time.sleep(3)  # the stack is being written
        scheduler.kill()
        t0 = time.monotonic()
        output, _ = command.communicate(timeout=120)
        assert time.monotonic() - t0 < 60, output
        assert command.returncode != 0
        record = json.loads(summary.read_text())
        assert record["status"] == "failed" and "scheduler" in record["reason"], record
    finally:
        for proc in (worker, scheduler):
            if proc is not None:
                proc.kill()
                proc.wait()
