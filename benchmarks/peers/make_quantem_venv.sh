#!/usr/bin/env bash
# Make benchmarks/peers/.venv-quantem: quantEM (the ptychography peer of bench_ptycho.py) and
# the PyTorch it runs on, in their own virtual environment, apart from outcore's, so that
# neither torch nor quantEM's many dependencies touch the project's environment.
#
#   benchmarks/peers/make_quantem_venv.sh      # or PYTHON=/path/to/python3.11 TORCH_SPEC=...
#
# torch is installed FIRST, on its own, so that pip takes the CPU build (torch==2.13.0 is a
# local "+cpu" wheel for Python 3.11 on this machine's package index) rather than resolving a
# CUDA build as a dependency of quantem, and then held there (a constraint) while quantem's
# dependencies install. Idempotent: a venv that already imports quantEM's ptychography is kept.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${QUANTEM_VENV:-$HERE/.venv-quantem}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
SPEC="${QUANTEM_SPEC:-quantem==0.1.10}"
CHECK="import torch, quantem.diffractive_imaging.ptychography"

if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "$CHECK" 2>/dev/null; then
    echo "$VENV: $("$VENV/bin/python" -c 'from importlib.metadata import version as v; print("quantem", v("quantem"), "torch", v("torch"))')"
    exit 0
fi

# A Python >= 3.11 (quantem's floor; the local torch wheel is built for 3.11): $PYTHON, else
# python3.11 / python3.12 / python3 on PATH.
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
# quantem's dependencies (torchvision, torchmetrics) would otherwise let pip swap the CPU torch
# for a newer CUDA build from the index: hold the installed one with a constraint.
"$VENV/bin/python" -c 'import torch; print("torch==" + torch.__version__)' > "$VENV/torch-pin.txt"
"$VENV/bin/python" -m pip install -q -c "$VENV/torch-pin.txt" "$SPEC" psutil
"$VENV/bin/python" - <<'PYEOF'
from importlib.metadata import version
import torch
import quantem.diffractive_imaging.ptychography  # noqa: F401
print("quantem", version("quantem"), "torch", torch.__version__,
      "cuda" if torch.cuda.is_available() else "cpu")
PYEOF
