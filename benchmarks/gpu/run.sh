#!/usr/bin/env bash
# One prepared GPU run of outcore (benchmarks/gpu/run.py says what it does and what it writes).
#
#   benchmarks/gpu/run.sh              on the GPU machine, from the repository root: results in $OUT
#   benchmarks/gpu/run.sh --dry-run    here: every step on the CPU, numpy at tiny sizes
#
# It runs on the machine's own Python 3 (OUTCORE_GPU_PYTHON, else python3), whose packages
# (cupy-cuda13x, numba, numpy, ...) the steps use, with the wheels of .whl/ (wheels.sh) on top.
set -u
here=$(cd "$(dirname "$0")" && pwd)
exec "${OUTCORE_GPU_PYTHON:-python3}" "$here/run.py" "$@"
