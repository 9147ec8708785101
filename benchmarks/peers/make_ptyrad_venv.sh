#!/usr/bin/env bash
# Make benchmarks/peers/.venv-ptyrad: PtyRAD (a ptychography peer of bench_ptycho.py and
# bench_real.py: automatic differentiation with Adam) and the PyTorch it runs on, in their own
# virtual environment, apart from outcore's.
#
#   benchmarks/peers/make_ptyrad_venv.sh       # or PYTHON=/path/to/python3.11 TORCH_SPEC=...
#
# torch goes in FIRST and alone, so that pip takes the CPU build (torch==2.13.0 is a local
# "+cpu" wheel on this machine's package index), and is then held by a constraint while
# ptyrad's dependencies install: without it pip may swap it for a newer CUDA build from the
# index. Idempotent: a venv that already imports ptyrad is kept.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${PTYRAD_VENV:-$HERE/.venv-ptyrad}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
SPEC="${PTYRAD_SPEC:-ptyrad==1.0.0}"
CHECK="import ptyrad, torch"

if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "$CHECK" 2>/dev/null; then
    echo "$VENV: $("$VENV/bin/python" -c 'from importlib.metadata import version as v; print("ptyrad", v("ptyrad"), "torch", v("torch"))')"
    exit 0
fi

# A Python >= 3.11 (the local torch wheel is built for 3.11).
find_python() {
    local candidate
    for candidate in "${PYTHON:-}" python3.11 python3.12 python3.13 python3; do
        [ -n "$candidate" ] || continue
        if "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
            command -v "$candidate" 2>/dev/null || echo "$candidate"
            return 0
        fi
    done
    return 1
}

PY="$(find_python)" || { echo "no Python >= 3.11 found: set PYTHON=/path/to/python3" >&2; exit 1; }
echo "making $VENV with $PY ($("$PY" --version 2>&1)), installing $TORCH_SPEC then $SPEC"
rm -rf "$VENV"
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "$TORCH_SPEC"
"$VENV/bin/python" -c 'import torch; print("torch==" + torch.__version__)' > "$VENV/torch-pin.txt"
"$VENV/bin/python" -m pip install -q -c "$VENV/torch-pin.txt" "$SPEC"
"$VENV/bin/python" -c 'from importlib.metadata import version; import torch, ptyrad
print("ptyrad", version("ptyrad"), "torch", torch.__version__, "cuda" if torch.cuda.is_available() else "cpu")'
