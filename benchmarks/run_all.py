"""Run every benchmark at a size that finishes in a few minutes on a 2-core machine.

Each script prints one JSON line per case; this runner passes them through, so
``make bench > bench.jsonl`` keeps a run to compare with later ones.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
SMALL = {
    "bench_read.py": ["--gib", "0.5", "--runs", "3"],
    "bench_fit.py": [],
    "bench_tomo.py": [],
    "bench_ptycho.py": ["--scan", "16", "--iterations", "3", "--quantem-ranks", "0"],
    "bench_tomo_center.py": ["--sizes", "128"],
    "bench_diffim.py": ["--size", "512", "--runs", "1", "--peers", "properimage"],
    "bench_diffim_accuracy.py": ["--pairs", "2"],
    "bench_sketch.py": ["--scan", "48x64", "--detector", "64", "--repeats", "1",
                        "--outcore-cases", "2x512MiB", "2xauto"],
    # the measured files of ../shared/real (without them: one "skipped" line), about 30 s
    "bench_real.py": ["--repeats", "1"],
    "bench_cli.py": ["--cases", "startup", "fit-dipoles", "tomo", "--fit-n", "2000",
                     "--fit-inputs", "npz", "--tomo-n", "64", "--tomo-methods", "fbp"],
}


def main() -> int:
    failed = 0
    for script, args in SMALL.items():
        print(f"# {script} {' '.join(args)}", file=sys.stderr, flush=True)
        done = subprocess.run([sys.executable, str(HERE / script), *args], cwd=HERE)
        failed += done.returncode != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
