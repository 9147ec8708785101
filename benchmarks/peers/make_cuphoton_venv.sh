#!/usr/bin/env bash
# Make benchmarks/peers/.venv-cuphoton: cuPhoton (a benchmark peer, Python >= 3.12) in its
# own virtual environment, apart from outcore's, for benchmarks/bench_fit.py --cuphoton.
#
#   benchmarks/peers/make_cuphoton_venv.sh            # or PYTHON312=/path/to/python3.12 ...
#
# Idempotent: an existing venv that already imports cuphoton is kept.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${CUPHOTON_VENV:-$HERE/.venv-cuphoton}"
SPEC="${CUPHOTON_SPEC:-cuphoton==0.1.3}"

if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import cuphoton.xfit" 2>/dev/null; then
    echo "$VENV: cuphoton $("$VENV/bin/python" -c 'import cuphoton; print(cuphoton.__version__)')"
    exit 0
fi

# A Python 3.12+ interpreter: $PYTHON312, else python3.12 / python3.13 on PATH, else pyenv's.
find_python() {
    local candidate
    for candidate in "${PYTHON312:-}" python3.12 python3.13 python3.14; do
        [ -n "$candidate" ] || continue
        if "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
            command -v "$candidate" 2>/dev/null || echo "$candidate"
            return 0
        fi
    done
    if command -v pyenv >/dev/null 2>&1; then
        for version in $(pyenv versions --bare 2>/dev/null | grep -E '^3\.1[234]\.' | sort -rV); do
            candidate="$(pyenv root)/versions/$version/bin/python3"
            if [ -x "$candidate" ]; then echo "$candidate"; return 0; fi
        done
    fi
    return 1
}

PY="$(find_python)" || {
    echo "no Python 3.12+ found (cuphoton needs it): set PYTHON312=/path/to/python3.12" >&2
    exit 1
}
echo "making $VENV with $PY ($("$PY" --version 2>&1)), installing $SPEC"
rm -rf "$VENV"
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "$SPEC"
"$VENV/bin/python" -c "import cuphoton, cuphoton.xfit; print('cuphoton', cuphoton.__version__)"
