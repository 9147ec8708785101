"""benchmarks/bench_tomo_center.py runs and reports the centre of its analytic discs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import outcore

BENCH = Path(__file__).parents[1] / "benchmarks"


def test_bench_reports_the_discs_centre_within_a_tenth_of_a_pixel():
    env = {**os.environ, "PYTHONPATH": str(Path(outcore.__file__).parents[1])}
    done = subprocess.run(
        [sys.executable, str(BENCH / "bench_tomo_center.py"), "--sizes", "64", "--noise", "0",
         "--no-scans", "--algotom-python", ""], capture_output=True, text=True, env=env,
        timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [json.loads(row) for row in done.stdout.splitlines() if row.startswith("{")]
    ours, peer = lines
    assert ours["tool"] == "outcore" and ours["case"] == {"group": "discs64_noise0.0",
                                                          "sinograms": 3}
    assert ours["max_abs_error_px"] < 0.1 and ours["runs"] == 3
    assert peer["tool"] == "algotom" and peer["value"] is None and "algotom" in peer["note"]
