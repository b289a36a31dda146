#!/usr/bin/env bash
# Ferry side by side with diffusers and accelerate, in one command:
#   bash bench/run.sh                    the default suite (CPU: ~12 min; see docs/benchmarks.md)
#   bash bench/run.sh --suite quick      a small smoke run
#   bash bench/run.sh --help             every option (python -m bench.compare --help)
#   bash bench/run.sh --paired ...       x resident from alternating forwards (bench/paired.py)
#   bash bench/run.sh --load-memory ...  RAM during load + forwards, per loader (bench/load_memory.py)
#   bash bench/run.sh --setup-only       only create the venv
# The peers are installed here only, into their own venv (.venv-bench, or $FERRY_BENCH_VENV),
# never into the project's .venv: torch==2.13.0 first, then requirements-bench.txt with
# -c constraints.txt, so no peer drags in another torch.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${FERRY_BENCH_VENV:-.venv-bench}
py="$venv/bin/python"
if [ ! -x "$py" ]; then
  python3 -m venv "$venv"
fi
stamp="$venv/.ferry-bench-stamp"
want=$(cat constraints.txt requirements.txt requirements-bench.txt | sha256sum | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "ferry-bench: installing into $venv (torch==2.13.0 first, then the peers constrained to it)"
  "$py" -m pip install -q --disable-pip-version-check torch==2.13.0
  "$py" -m pip install -q --disable-pip-version-check -c constraints.txt -r requirements-bench.txt
  echo "$want" > "$stamp"
fi
if [ "${1:-}" = "--setup-only" ]; then
  echo "ferry-bench: $venv is ready"
  exit 0
fi
export TORCHAO_FORCE_SKIP_LOADING_SO_FILES=1 PYTHONUNBUFFERED=1
if [ "${1:-}" = "--paired" ]; then
  shift
  exec "$py" -m bench.paired "$@"   # x-resident in alternating pairs, one process
fi
if [ "${1:-}" = "--load-memory" ]; then
  shift
  exec "$py" -m bench.load_memory "$@"   # peak RAM from the file on (issue 11)
fi
exec "$py" -m bench.compare "$@"
