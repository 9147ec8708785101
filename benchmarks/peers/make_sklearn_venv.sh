#!/usr/bin/env bash
# Make benchmarks/peers/.venv-sklearn: scikit-learn's randomized_svd (the peer of
# bench_sketch.py) with zarr to read the same store, in a virtual environment apart from
# outcore's.
#
#   benchmarks/peers/make_sklearn_venv.sh      # or PYTHON=... SKLEARN_SPEC=... ZARR_SPEC=...
#
# Idempotent: a venv that already imports sklearn and zarr is kept.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${SKLEARN_VENV:-$HERE/.venv-sklearn}"
PY="${PYTHON:-python3}"
CHECK='import sklearn.utils.extmath, zarr'
if ! [ -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "$CHECK" 2>/dev/null; then
    echo "making $VENV with $PY"
    rm -rf "$VENV"
    "$PY" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip
    "$VENV/bin/python" -m pip install -q "${SKLEARN_SPEC:-scikit-learn}" "${ZARR_SPEC:-zarr>=3}"
    "$VENV/bin/python" -c "$CHECK"
fi
"$VENV/bin/python" -c 'from importlib.metadata import version as v; print("scikit-learn", v("scikit-learn"), "zarr", v("zarr"), "numpy", v("numpy"))'
