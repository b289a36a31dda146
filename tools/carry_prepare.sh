#!/usr/bin/env bash
# Prepares what a lent GPU machine lacks, into ignored folders of this repo (never committed):
#   .comfyui/  a ComfyUI source tree (default /work/comfyui, or $1), without venv/.git/tests
#   .whl/      wheels for the GPU image's Python 3.12: diffusers (+ importlib_metadata 8.x),
#              torchao, torchsde (+ trampoline); that image has the rest (facts.md, KINDS.md)
# Then: run(carry=[".comfyui", ".whl"], command="FERRY_COMFYUI=.comfyui bash tools/gpu_suite.sh h2h").
# Prints the carried size; the working tree plus these must stay under 64 MiB.
set -euo pipefail
cd "$(dirname "$0")/.."
src=${1:-/work/comfyui}
[ -f "$src/main.py" ] || { echo "carry: $src is not a ComfyUI source tree (no main.py)" >&2; exit 2; }
rm -rf .comfyui && mkdir .comfyui
tar -C "$src" --exclude=./venv --exclude=./.git --exclude=./tests --exclude=./tests-unit \
  --exclude=__pycache__ --exclude=./output --exclude=./input -cf - . | tar -C .comfyui -xf -
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .whl \
  diffusers==0.42.1 "importlib_metadata>=8,<9" torchao==0.18.0 torchsde==0.2.6 trampoline==0.1.2
du -sh .comfyui .whl
git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | awk '{printf "carry: tracked files %.1f MiB\n", $1/1048576}'
