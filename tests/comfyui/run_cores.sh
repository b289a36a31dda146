#!/usr/bin/env bash
# The opt-in real-ComfyUI suite on every ComfyUI core Ferry supports, one after another, with
# one summary line per core at the end:
#   bash tests/comfyui/run_cores.sh [CHECKOUT ...] [-- PYTEST ARGS]
# Each CHECKOUT is a ComfyUI source tree with its own venv/ (default: the three this project
# tests on: /work/comfy/v0.3.64, /work/comfy/v0.8.0, /work/comfy/v0.33.0). The test runner is
# $FERRY_PY (default: .venv/bin/python, else python3); each server runs on its core's venv.
# Exits non-zero if any core's run failed. Logs: ${FERRY_CORES_LOG:-/tmp/ferry-cores}/<core>.log
# The cores and their venvs (and ComfyUI-GGUF, and Forge for tests/forge) are set up by
# `bash tools/real_hosts.sh` from the repositories' snapshots (docs/real-hosts.md).
set -uo pipefail
cd "$(dirname "$0")/../.."
cores=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do cores+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
[ ${#cores[@]} -eq 0 ] && cores=(/work/comfy/v0.3.64 /work/comfy/v0.8.0 /work/comfy/v0.33.0)
if [ -n "${FERRY_PY:-}" ]; then py=$FERRY_PY
elif [ -x .venv/bin/python ]; then py=.venv/bin/python
else py=python3
fi
# The head-to-head's dyn-* rows need a core with dynamic VRAM: the first given one that has it.
if [ -z "${FERRY_COMFYUI_DYNAMIC:-}" ]; then
  for core in "${cores[@]}"; do
    if grep -q "def get_non_dynamic_delegate" "$core/comfy/model_patcher.py" 2>/dev/null; then
      export FERRY_COMFYUI_DYNAMIC=$core
      break
    fi
  done
fi
logs=${FERRY_CORES_LOG:-/tmp/ferry-cores}
mkdir -p "$logs"
status=0
summary=()
for core in "${cores[@]}"; do
  name=$(basename "$core")
  version=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' "$core/comfyui_version.py" 2>/dev/null)
  echo "== ComfyUI ${version:-?} at $core (log: $logs/$name.log)"
  FERRY_COMFYUI="$core" "$py" -m pytest tests/comfyui -q -p no:cacheprovider "$@" 2>&1 | tee "$logs/$name.log"
  rc=${PIPESTATUS[0]}
  [ "$rc" -ne 0 ] && status=1
  line=$(grep -E '^(=+ )?[0-9]+ (passed|failed|error|skipped)' "$logs/$name.log" | tail -1 | sed 's/=//g; s/^ *//; s/ *$//')
  summary+=("ComfyUI ${version:-?} ($core): ${line:-no result (exit $rc)}")
done
echo
printf '%s\n' "${summary[@]}"
exit "$status"
