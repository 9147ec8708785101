#!/usr/bin/env bash
# Make the venvs of bench_diffim.py's peers, apart from outcore's: properimage's ZOGY
# (benchmarks/peers/.venv-properimage) and SFFT with its numpy backend
# (benchmarks/peers/.venv-sfft), both from the package index, on Python 3.11 or newer.
#
#   benchmarks/peers/make_diffim_venvs.sh           # or PYTHON=/path/to/python3.12 ...
#
# Idempotent: a venv that already imports its package is kept.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PY="${PYTHON:-python3}"

make_venv() {  # make_venv NAME IMPORT PRE SPEC...: PRE is installed first, unisolated
    local venv="$HERE/.venv-$1" module="$2" pre="$3"
    shift 3
    if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import $module" 2>/dev/null; then
        echo "$venv: $module imports"
        return 0
    fi
    echo "making $venv with $PY, installing $*"
    rm -rf "$venv"
    "$PY" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip "setuptools<70" wheel numpy
    if [ -n "$pre" ]; then
        "$venv/bin/python" -m pip install -q --no-build-isolation $pre
    fi
    "$venv/bin/python" -m pip install -q "$@"
    "$venv/bin/python" -c "import $module; print('$module imports')"
}

# properimage needs tinynpydb, whose setup.py fetches an old setuptools from the network
# unless one with pkg_resources is already there: build it against the venv's own.
make_venv properimage properimage.operations tinynpydb "${PROPERIMAGE_SPEC:-properimage==0.7.2}"
make_venv sfft sfft.CustomizedPacket "" "${SFFT_SPEC:-sfft==1.7.3}"
