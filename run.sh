#!/usr/bin/env bash
# One entry point for everything: sets up .venv on first use, then runs a job.
#   bash run.sh [panel] [--port 7860 --no-browser]      the main job: the panel on the demo model
#   bash run.sh demo [--size-gb 2 --tier pinned ...]   the CLI demo: resident vs offloaded table
#   bash run.sh test [pytest args]                      lint, type-check and the test suite
#   bash run.sh platforms [windows|macos]               the I/O tests under the stand-ins
set -euo pipefail
cd "$(dirname "$0")"
job=panel
case "${1:-}" in
  ""|-*) ;;                 # no job named: the panel, with any flags given
  *) job=$1; shift ;;
esac
venv=${FERRY_VENV:-.venv}
py="$venv/bin/python"
if [ ! -x "$py" ]; then
  python3 -m venv "$venv"
fi
# Reinstall only when a requirements file changed since the last install (not the second
# Gradio's file nor comfy-cli's: each goes into its own venv, below, and must not reinstall this one).
stamp="$venv/.ferry-stamp"
want=$(cat constraints.txt $(ls requirements*.txt | grep -vxE 'requirements-(gradio4|comfycli).txt') | sha256sum | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "ferry: installing into $venv (torch==2.13.0 first, then the rest constrained to it)"
  "$py" -m pip install -q --disable-pip-version-check torch==2.13.0
  "$py" -m pip install -q --disable-pip-version-check -c constraints.txt -r requirements-dev.txt
  echo "$want" > "$stamp"
fi
export TORCHAO_FORCE_SKIP_LOADING_SO_FILES=${TORCHAO_FORCE_SKIP_LOADING_SO_FILES:-1}
# A venv of its own beside .venv for one tool the tests drive (DIR REQUIREMENTS WHAT [torch]):
# made on first use, reinstalled when its requirements change; prints its absolute path.
side_venv() {
  local v=$1 reqs=$2 what=$3 torch=${4:-}
  [ -x "$v/bin/python" ] || python3 -m venv "$v" >&2
  local want
  want=$(cat constraints.txt "$reqs" | sha256sum | cut -c1-16)
  if [ "$(cat "$v/.ferry-stamp" 2>/dev/null)" != "$want" ]; then
    echo "ferry: installing $what into $v" >&2
    if [ -n "$torch" ]; then
      "$v/bin/python" -m pip install -q --disable-pip-version-check torch==2.13.0 >&2
    fi
    "$v/bin/python" -m pip install -q --disable-pip-version-check -c constraints.txt -r "$reqs" >&2
    echo "$want" > "$v/.ferry-stamp"
  fi
  case "$v" in /*) echo "$v" ;; *) echo "$PWD/$v" ;; esac
}
# The panel runs on Forge's Gradio (4.40) as well as on 6: the tests drive it in a second venv.
gradio4_venv() {
  local v
  v=$(side_venv "${FERRY_GRADIO4_VENV:-.venv-gradio4}" requirements-gradio4.txt \
    "Gradio 4.40 (the panel's second Gradio, for its tests)" torch)
  export FERRY_GRADIO4_PYTHON=${FERRY_GRADIO4_PYTHON:-$v/bin/python}
}
# The Comfy Registry's installer (comfy-cli) in its own venv, for tests/test_registry_pack.py.
comfycli_venv() {
  local v
  v=$(side_venv "${FERRY_COMFYCLI_VENV:-.venv-comfycli}" requirements-comfycli.txt \
    "comfy-cli (the Registry's installer, for its tests)")
  export FERRY_COMFY_CLI=${FERRY_COMFY_CLI:-$v/bin/comfy}
}
case "$job" in
  panel) exec "$py" tools/panel.py "$@" ;;
  demo)  exec "$py" -m offload_core.tools.demo "$@" ;;
  test)
    gradio4_venv
    comfycli_venv
    "$py" -m ruff check .
    "$py" -m ruff format --check .
    "$py" -m mypy
    exec "$py" -m pytest "$@"
    ;;
  platforms)
    # The offload_core and nodes tests that touch files, mappings and the lifecycle, under
    # tests/platform_standin.py's Windows and macOS stand-ins (README: Platforms).
    io_tests=(tests/test_platform.py tests/test_file_backend.py tests/test_equivalence.py
      tests/test_faults.py tests/test_recovery.py tests/test_lifecycle.py tests/test_mapped.py
      tests/test_window_read.py tests/test_stream_load.py tests/test_stream_memory.py
      tests/test_stream_quant.py tests/test_descriptor_limit.py tests/test_host_memory.py
      tests/test_quant_offload.py tests/test_nodes_recovery.py tests/test_nodes_binding.py
      tests/test_settings_parsers.py)
    status=0
    for standin in ${1:-windows macos}; do
      echo "ferry: the I/O tests under the $standin stand-in"
      PYTHONPATH="$PWD/tests/platform_site${PYTHONPATH:+:$PYTHONPATH}" FERRY_PLATFORM_STANDIN=$standin \
        "$py" -m pytest -q "${io_tests[@]}" || status=1
    done
    exit $status
    ;;
  *) echo "usage: bash run.sh {panel|demo|test|platforms} [args]" >&2; exit 2 ;;
esac
