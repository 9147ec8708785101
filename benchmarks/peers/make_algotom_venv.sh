#!/usr/bin/env bash
# Make benchmarks/peers/.venv-algotom: algotom (centre finding, stripe removal, Paganin; the
# peer of bench_tomo_raw.py) beside the ASTRA Toolbox for its CPU 2-D FBP, in one virtual
# environment apart from outcore's. astra-toolbox's only wheel is for CPython 3.11, so the venv
# is made by make_astra_venv.sh (same Python, same astra pin) and algotom is added to it.
#
#   benchmarks/peers/make_algotom_venv.sh      # or PYTHON=... ASTRA_SPEC=... ALGOTOM_SPEC=...
#
# Idempotent: a venv that already imports algotom and runs an ASTRA CPU projector is kept.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${ALGOTOM_VENV:-$HERE/.venv-algotom}"
SPEC="${ALGOTOM_SPEC:-algotom==1.7.0}"
CHECK='import algotom.prep.calculation, algotom.prep.removal, algotom.prep.phase, algotom.prep.correction'

ASTRA_VENV="$VENV" "$HERE/make_astra_venv.sh"
if ! "$VENV/bin/python" -c "$CHECK" 2>/dev/null; then
    echo "installing $SPEC into $VENV"
    "$VENV/bin/python" -m pip install -q "$SPEC"
    "$VENV/bin/python" -c "$CHECK"
fi
"$VENV/bin/python" -c 'from importlib.metadata import version as v; print("algotom", v("algotom"), "astra-toolbox", v("astra-toolbox"), "numpy", v("numpy"))'
