#!/usr/bin/env bash
# Make benchmarks/peers/.venv-diffct: diffct (a benchmark peer of bench_tomo.py) and the
# PyTorch it runs on, in their own virtual environment, apart from outcore's, so that neither
# torch nor diffct's pins (numba, numpy < 2.5) touch the project's environment.
#
#   benchmarks/peers/make_diffct_venv.sh        # or PYTHON=/path/to/python3.11 TORCH_SPEC=...
#
# torch is installed FIRST, on its own, so that pip takes the CPU build (torch==2.13.0 is a
# local "+cpu" wheel on this machine's package index) rather than resolving a CUDA build as
# a dependency of diffct. Idempotent: an existing venv that already imports diffct is kept.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${DIFFCT_VENV:-$HERE/.venv-diffct}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
SPEC="${DIFFCT_SPEC:-diffct==2.5.0}"

if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import diffct, torch" 2>/dev/null; then
    echo "$VENV: diffct $("$VENV/bin/python" -c 'from importlib.metadata import version as v; print(v("diffct"), "torch", v("torch"))')"
    exit 0
fi

# A Python >= 3.10 (diffct's floor): $PYTHON, else python3.11 / python3.12 / python3 on PATH.
find_python() {
    local candidate
    for candidate in "${PYTHON:-}" python3.11 python3.12 python3.13 python3; do
        [ -n "$candidate" ] || continue
        if "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
            command -v "$candidate" 2>/dev/null || echo "$candidate"
            return 0
        fi
    done
    return 1
}

PY="$(find_python)" || { echo "no Python >= 3.10 found: set PYTHON=/path/to/python3" >&2; exit 1; }
echo "making $VENV with $PY ($("$PY" --version 2>&1)), installing $TORCH_SPEC then $SPEC"
rm -rf "$VENV"
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "$TORCH_SPEC"
"$VENV/bin/python" -m pip install -q "$SPEC"
"$VENV/bin/python" - <<'EOF'
from importlib.metadata import version
import diffct, torch  # noqa: F401
print("diffct", version("diffct"), "torch", torch.__version__,
      "cuda" if torch.cuda.is_available() else "cpu")
EOF
