#!/usr/bin/env bash
# Prepares what a lent GPU machine lacks, into ignored folders of this repo (never committed):
#   .comfyui/          the legacy ComfyUI source tree (default /work/comfy/v0.3.64, or $1),
#                      without venv/.git/tests
#   .comfyui-dynamic/  a current ComfyUI with dynamic VRAM (default /work/comfy/v0.33.0, or $2),
#                      for the head-to-head's dyn-* rows
#   .whl/              wheels for the GPU image's Python 3.12: diffusers (+ importlib_metadata
#                      8.x), torchao, torchsde (+ trampoline); that image has the rest (facts.md)
#   .whl-dynamic/      comfy-aimdo and comfy-kitchen for Python 3.12, which the current core
#                      imports unguarded (comfy-kitchen alone is ~58 MB)
# One call carries at most 64 MiB with the working tree, so the calls go (facts.md, third round):
#   1. carry [".whl-dynamic"]:             bash tools/gpu_suite.sh install
#      (installs into /tmp/ferry-site, which lasts while the machine stays warm)
#   2. carry [".comfyui-dynamic", ".whl"]: FERRY_COMFYUI_DYNAMIC=.comfyui-dynamic \
#                                          bash tools/gpu_suite.sh h2h    (the dyn-* rows first)
#   3. carry [".comfyui", ".whl"]:         FERRY_COMFYUI=.comfyui FERRY_COMFYUI_DYNAMIC=.comfyui-dynamic \
#                                          bash tools/gpu_suite.sh h2h    (resumes; the whole table)
# Prints what each call carries; each must stay under 64 MiB.
set -euo pipefail
cd "$(dirname "$0")/.."
legacy=${1:-/work/comfy/v0.3.64}
dynamic=${2:-/work/comfy/v0.33.0}
copy_core() {  # copy_core SRC DEST: a ComfyUI source tree without what a run does not need
  [ -f "$1/main.py" ] || { echo "carry: $1 is not a ComfyUI source tree (no main.py)" >&2; exit 2; }
  rm -rf "$2" && mkdir "$2"
  tar -C "$1" --exclude=./venv --exclude=./.git --exclude=./tests --exclude=./tests-unit \
    --exclude=__pycache__ --exclude=./output --exclude=./input --exclude=./blueprints \
    --exclude=./script_examples -cf - . | tar -C "$2" -xf -
}
copy_core "$legacy" .comfyui
copy_core "$dynamic" .comfyui-dynamic
wheels() {  # wheels DEST SPEC...: Python 3.12 manylinux wheels, no dependencies
  local dest=$1; shift
  mkdir -p "$dest"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$dest" "$@"
}
wheels .whl diffusers==0.42.1 "importlib_metadata>=8,<9" torchao==0.18.0 torchsde==0.2.6 \
  trampoline==0.1.2
wheels .whl-dynamic comfy-aimdo==0.4.13 comfy-kitchen==0.2.31
tracked=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
size() { du -sb "$@" | awk -v t="$tracked" '{s += $1} END {printf "%.1f MiB", (s + t) / 1048576}'; }
echo "carry: call 1 [.whl-dynamic]: $(size .whl-dynamic)"
echo "carry: call 2 [.comfyui-dynamic .whl]: $(size .comfyui-dynamic .whl)"
echo "carry: call 3 [.comfyui .whl]: $(size .comfyui .whl)"
