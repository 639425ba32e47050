#!/usr/bin/env bash
# Fill deploy/wheelhouse/ with wheels for everything the image installs, so that
#   docker build -f deploy/Dockerfile --build-arg WHEELHOUSE=1 --target cpu .
# installs with `pip install --no-index` (air-gapped, reproducible, no PyPI from the build).
#
# Run it from any directory, with a Python of the image's minor version (3.11 by default):
# wheels built here from source distributions are tagged for this interpreter and glibc.
#
#   deploy/wheelhouse.sh                 # CPU torch from the PyTorch CPU index
#   TORCH_INDEX_URL= deploy/wheelhouse.sh  # torch from pip's own configuration (index, find-links)
#
# Environment: PYTHON (default python3), TORCH_VERSION (2.13.0, as in the Dockerfile),
# TORCH_INDEX_URL (https://download.pytorch.org/whl/cpu; empty = pip's configuration),
# WHEELHOUSE (default deploy/wheelhouse). Wheels already there are reused.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-python3}"
torch_version="${TORCH_VERSION:-2.13.0}"
torch_index="${TORCH_INDEX_URL-https://download.pytorch.org/whl/cpu}"
out="${WHEELHOUSE:-$root/deploy/wheelhouse}"
want_minor="${IMAGE_PYTHON:-3.11}"

have_minor="$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
if [[ "$have_minor" != "$want_minor" ]]; then
    echo "wheelhouse.sh: $python is Python $have_minor, the image runs $want_minor" \
         "(set PYTHON=python$want_minor, or IMAGE_PYTHON for another base image)" >&2
    exit 2
fi
mkdir -p "$out"
pip=("$python" -m pip)

# 1. torch, alone, from its own index: the CPU build (no multi-GB CUDA wheels).
if [[ -n "$torch_index" ]]; then
    "${pip[@]}" download --dest "$out" --index-url "$torch_index" "torch==$torch_version"
else
    "${pip[@]}" download --dest "$out" "torch==$torch_version"
fi
# 2. The build backend (the image builds the project from its source, without an index).
"${pip[@]}" wheel --wheel-dir "$out" --find-links "$out" "setuptools>=68" wheel
# 3. The project's dependencies at the versions CI tested; sdists become wheels here.
"${pip[@]}" wheel --wheel-dir "$out" --find-links "$out" \
    --constraint "$root/deploy/constraints.txt" "torch==$torch_version" "$root"
# The project itself is built in the image from the copied source, never from here.
rm -f "$out"/swarm_node-*.whl

torch_wheels=("$out"/torch-"$torch_version"*.whl)
echo "wheelhouse: $(find "$out" -name '*.whl' | wc -l) wheels, $(du -sh "$out" | cut -f1)" \
     "in $out (torch: $(basename "${torch_wheels[0]}"))"
