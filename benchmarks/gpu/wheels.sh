#!/usr/bin/env bash
# Download, for CPython 3.12 on manylinux x86-64, the wheels the H200 machine lacks
# (benchmarks/gpu/wheels.txt, one version each) into the git-ignored .whl/ at the repository
# root, check the set (wheelset.py), and print what the run would carry.
#
#   benchmarks/gpu/wheels.sh        # run here, with network; refused if .whl/ exists
#
# PYTHON (default python3) is the pip that downloads; WHEEL_DIR (default .whl) where to.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
dest=${WHEEL_DIR:-$repo/.whl}
python=${PYTHON:-python3}
limit_mib=64

if [ -e "$dest" ]; then
    echo "wheels.sh: $dest already exists; nothing is overwritten. Fix: remove it first" \
         "(rm -rf $dest) to download the set again." >&2
    exit 1
fi
partial="$dest.partial"
rm -rf "$partial"
mapfile -t pins < <(sed 's/#.*//' "$here/wheels.txt" | awk 'NF {print $1}')
# pip matches each manylinux tag exactly: these cover every wheel of wheels.txt
"$python" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 \
    -d "$partial" "${pins[@]}"
"$python" "$here/wheelset.py" "$partial"
mv "$partial" "$dest"

# what a run carries: the working tree (tracked and untracked-not-ignored files) and .whl
tree_bytes=$(cd "$repo" && git ls-files -co --exclude-standard -z \
    | xargs -0 -r stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
whl_bytes=$(du -sb "$dest" | cut -f1)
total=$((tree_bytes + whl_bytes))
awk -v d="$dest" -v h="$(du -sh "$dest" | cut -f1)" -v t="$tree_bytes" -v a="$total" \
    -v m="$limit_mib" 'BEGIN {printf "wheels.sh: %s: %s (du -sh); working tree %.1f MiB; " \
    "together %.1f MiB of %d MiB\n", d, h, t / 1048576, a / 1048576, m}'
if [ "$total" -ge $((limit_mib * 1048576)) ]; then
    echo "wheels.sh: the working tree and .whl come to more than $limit_mib MiB, the most a" \
         "run carries. Fix: drop wheels from wheels.txt or files from the tree." >&2
    exit 1
fi
