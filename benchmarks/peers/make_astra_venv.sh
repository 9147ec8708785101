#!/usr/bin/env bash
# Make benchmarks/peers/.venv-astra: the ASTRA Toolbox (the tomography peer of bench_cli.py) in
# its own virtual environment, apart from outcore's. Its PyPI wheel (astra-toolbox 2.5.0) is
# built for CPython 3.11 and pulls the CUDA runtime and cuFFT wheels, which its CPU 2-D
# algorithms (FBP, SIRT, CGLS with a "linear" or "strip" projector) never load a GPU through.
#
#   benchmarks/peers/make_astra_venv.sh        # or PYTHON=/path/to/python3.11 ASTRA_SPEC=...
#
# Idempotent: a venv that already imports astra and runs a CPU projector is kept.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${ASTRA_VENV:-$HERE/.venv-astra}"
SPEC="${ASTRA_SPEC:-astra-toolbox==2.5.0}"
CHECK='import astra; astra.create_projector("linear", astra.create_proj_geom("parallel", 1.0, 4, [0.0]), astra.create_vol_geom(4, 4))'

if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "$CHECK" 2>/dev/null; then
    echo "$VENV: astra-toolbox $("$VENV/bin/python" -c 'from importlib.metadata import version; print(version("astra-toolbox"))')"
    exit 0
fi

# CPython 3.11 (the only wheel): $PYTHON, else python3.11 on PATH, else pyenv's newest 3.11.
find_python() {
    local candidate
    for candidate in "${PYTHON:-}" python3.11 python3; do
        [ -n "$candidate" ] || continue
        if "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
            command -v "$candidate" 2>/dev/null || echo "$candidate"
            return 0
        fi
    done
    if command -v pyenv >/dev/null 2>&1; then
        for version in $(pyenv versions --bare 2>/dev/null | grep -E '^3\.11\.' | sort -rV); do
            candidate="$(pyenv root)/versions/$version/bin/python3"
            if [ -x "$candidate" ]; then echo "$candidate"; return 0; fi
        done
    fi
    return 1
}

PY="$(find_python)" || { echo "no Python 3.11 found (astra-toolbox's wheel needs it): set PYTHON=/path/to/python3.11" >&2; exit 1; }
echo "making $VENV with $PY ($("$PY" --version 2>&1)), installing $SPEC"
rm -rf "$VENV"
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "$SPEC"
"$VENV/bin/python" -c "$CHECK"
"$VENV/bin/python" -c 'from importlib.metadata import version; print("astra-toolbox", version("astra-toolbox"), "(CPU projector works)")'
