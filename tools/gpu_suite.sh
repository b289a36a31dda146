#!/usr/bin/env bash
# The GPU suite in one command, for a lent GPU machine:
#   bash tools/gpu_suite.sh              tests, sanitizer run, benchmark (all)
#   bash tools/gpu_suite.sh tests        the GPU tests and the TORCH_CUDA_SANITIZER run only
#   bash tools/gpu_suite.sh bench [ARGS] the benchmark only (ARGS go to python -m bench.compare)
#   bash tools/gpu_suite.sh h2h [ARGS]   the head-to-head only (ARGS go to python -m bench.h2h):
#       Ferry vs ComfyUI core vs diffusers, KSampler on one model, VRAM capped at 12 and 24 GB.
#       Real ComfyUI when FERRY_COMFYUI names a source tree (tools/carry_prepare.sh makes
#       .comfyui/); FERRY_COMFYUI_DYNAMIC names a current one (.comfyui-dynamic/, v0.33) for the
#       dyn-* rows, which run first: v0.33 with its defaults (dynamic VRAM, pinned memory, async
#       offload), with --fast-disk, and Ferry on it. It resumes: run it again in the next
#       10-minute call until nothing is left (the calls and what each carries: carry_prepare.sh).
#   bash tools/gpu_suite.sh install      only installs the carried wheels (.whl/, .whl-dynamic/)
#       into /tmp/ferry-site, which later calls on the same warm machine use.
# Everything it prints is also written under bench/results/ (and copied to $OUT when set).
#
# Python: $FERRY_PY, else .venv-bench/bin/python (made by `bash bench/run.sh --setup-only`),
# else python3. A machine with no package registry (a lent GPU) uses its own torch; carry the
# missing packages as wheels in .whl/ (diffusers, torchao; see docs/benchmarks.md) and they
# are installed from there, offline. Without them the diffusers rows say "not installed".
#
# Without CUDA it runs the CPU part (the GPU test files, which skip, and the CPU stream-order
# test that drives PyTorch's CUDA-Sanitizer engine) and the head-to-head's dry run at a tiny
# size (same pipeline, same table), says "no GPU" once, and exits 0.
set -uo pipefail
cd "$(dirname "$0")/.."
part=${1:-all}
[ $# -gt 0 ] && shift
case "$part" in all|tests|bench|h2h|install) ;; *) echo "usage: bash tools/gpu_suite.sh [all|tests|bench|h2h|install] [args]" >&2; exit 2 ;; esac

if [ -n "${FERRY_PY:-}" ]; then py=$FERRY_PY
elif [ -x .venv-bench/bin/python ]; then py=.venv-bench/bin/python
else py=python3
fi
export TORCHAO_FORCE_SKIP_LOADING_SO_FILES=1 PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
status=0
gpu=$("$py" -c 'import torch; print(torch.cuda.get_device_name().replace(" ", "-") if torch.cuda.is_available() else "")' 2>/dev/null)
# The carried wheels are built for the lent machine's Python 3.12: install them only there, into
# /tmp/ferry-site, which outlives the call while the machine stays warm (the dynamic core's two
# wheels fill one call alone: they come in a call of their own, `install`).
wheels=$(ls .whl/*.whl .whl-dynamic/*.whl 2>/dev/null)
if [ -n "$gpu" ] && [ -n "$wheels" ]; then
  echo "gpu-suite: installing carried wheels into /tmp/ferry-site (offline)"
  # shellcheck disable=SC2086  # one word per wheel path
  "$py" -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/ferry-site \
    $wheels || status=1
fi
[ -d /tmp/ferry-site ] && export PYTHONPATH="$PYTHONPATH:/tmp/ferry-site"
if [ "$part" = install ]; then
  [ -n "$gpu" ] || echo "gpu-suite: no GPU: the carried wheels are for the lent GPU's Python 3.12; nothing installed"
  exit "$status"
fi

results=bench/results
stamp=$(date -u +%Y%m%dT%H%M%SZ)

run() {  # run NAME CMD...: tee the output to bench/results/<stamp>-NAME.txt
  local name=$1; shift
  local log="$results/$stamp-$name.txt"
  echo "== $name: $*"
  "$@" 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  echo "== $name: exit $rc (log: $log)"
  [ -n "${OUT:-}" ] && cp "$log" "$OUT/" 2>/dev/null
  return "$rc"
}

if [ -z "$gpu" ]; then
  if [ "$part" = all ] || [ "$part" = tests ]; then
    echo "== cpu part: $py -m pytest tests/test_gpu.py tests/test_gguf_gpu.py tests/test_stream_ordering.py tests/test_stream_backend.py"
    "$py" -m pytest -q -p no:cacheprovider tests/test_gpu.py tests/test_gguf_gpu.py tests/test_stream_ordering.py tests/test_stream_backend.py || status=$?
  fi
  if [ "$part" = all ] || [ "$part" = h2h ]; then
    echo "== h2h dry run: $py -m bench.h2h --steps 2 --fresh $*"
    "$py" -m bench.h2h --steps 2 --fresh --workdir "${FERRY_H2H_DIR:-/tmp/ferry-h2h-dry}" "$@" || status=$?
  fi
  echo
  echo "gpu-suite: no GPU (torch.cuda.is_available() is False with $py): ran the CPU part only; the GPU tests, the sanitizer run and the GPU benchmark need a CUDA device."
  exit "$status"
fi

mkdir -p "$results"
echo "gpu-suite: $gpu, python $py"
"$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
if [ "$part" = all ] || [ "$part" = tests ]; then
  run gpu-tests "$py" -m pytest -q -p no:cacheprovider tests/test_gpu.py tests/test_quant_gpu.py tests/test_gguf_gpu.py -k "not sanitizer" || status=1
  # The CUDA Sanitizer run: the test launches the offloaded model under TORCH_CUDA_SANITIZER=1
  # and fails on any race the sanitizer reports.
  run cuda-sanitizer "$py" -m pytest -q -p no:cacheprovider tests/test_gpu.py -k sanitizer || status=1
fi
if [ "$part" = all ] || [ "$part" = bench ]; then
  # Default GPU suite (bench/compare.py suite()): Flux at full width 3072, 6 double + 12 single
  # blocks, bf16 (~3.8 B params, ~7.6 GB), at 4096+512 and 1024+256 tokens. To stay inside a
  # 10-minute call, run one size per call: bench --model flux --tokens 4096 --txt-tokens 512
  report="$results/$stamp-bench-$gpu.md"
  run bench "$py" -m bench.compare --out "$report" "$@" || status=1
  [ -n "${OUT:-}" ] && cp "$report" "$OUT/" 2>/dev/null
  # The compile rows: eager and compiled, resident and Ferry (pinned), and the first step's
  # compile time (bench/compile_paired.py; every Ferry output torch.equal to its resident one).
  run compile "$py" -m bench.compile_paired --device cuda --dtype bf16 --size-gb 2 \
    --tokens 1024 --tier pinned --rounds 5 || status=1
fi
if [ "$part" = all ] || [ "$part" = h2h ]; then
  # Flux-dev-shaped (~12 B params, ~24 GB bf16, made on this GPU), 1024x1024, KSampler. One
  # 10-minute call will not finish every row: each call resumes the rows left (--budget-s),
  # the current core's (dyn-*) first, at the tightest cap first.
  report="$results/h2h-$gpu.md"
  run h2h "$py" -m bench.h2h --out "$report" "$@" || status=1
  [ -n "${OUT:-}" ] && cp "$report" "$OUT/" 2>/dev/null
fi
echo "gpu-suite: done, exit $status; results in $results/"
exit "$status"
