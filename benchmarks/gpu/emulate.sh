#!/usr/bin/env bash
# Stand in, here, for the H200 machine's Python: a new Python 3.12 venv holding, from the
# index, only those of the machine's packages (device-packages.txt) that outcore, its tests
# and the benchmarks import; no cupy (no GPU here). A dry run on it then checks that the
# wheels of .whl install with --no-index --no-deps and that outcore runs on them:
#
#   benchmarks/gpu/emulate.sh /tmp/cleanpy312       # refused if the folder exists
#   OUTCORE_GPU_PYTHON=/tmp/cleanpy312/bin/python benchmarks/gpu/run.sh --dry-run
#
# PYTHON312 is the interpreter (default: pyenv's 3.12.1).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
target=${1:?usage: emulate.sh FOLDER}
python=${PYTHON312:-$(pyenv root 2>/dev/null)/versions/3.12.1/bin/python3}
# numpy at the version read on the machine (KINDS.md); the others as the index has them
packages=(numpy==2.5.2 scipy pandas pyarrow xarray h5py numba psutil pyyaml toolz cloudpickle
          msgpack sortedcontainers click packaging fsspec jinja2 contourpy pillow narwhals
          typing-extensions tifffile nvidia-ml-py cuda-pathfinder scikit-image pytest
          pytest-timeout)
if [ -e "$target" ]; then
    echo "emulate.sh: $target already exists; nothing is overwritten. Fix: remove it or give" \
         "another folder." >&2
    exit 1
fi
for spec in "${packages[@]}"; do
    name=${spec%%==*}
    if ! grep -qix "$name" "$here/device-packages.txt"; then
        echo "emulate.sh: $name is not among the machine's packages (device-packages.txt)." >&2
        exit 1
    fi
done
"$python" -m venv "$target"
"$target/bin/python" -m pip install --quiet --disable-pip-version-check "${packages[@]}"
echo "emulate.sh: $target/bin/python: $("$target/bin/python" --version), ${#packages[@]} of" \
     "the machine's packages, no cupy"
