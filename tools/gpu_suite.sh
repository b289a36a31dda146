#!/usr/bin/env bash
# The GPU suite in one command, for a lent GPU machine:
#   bash tools/gpu_suite.sh              tests, sanitizer run, benchmark (all)
#   bash tools/gpu_suite.sh tests        the GPU tests and the TORCH_CUDA_SANITIZER run, then the rows
#   bash tools/gpu_suite.sh rows         the issue-41 rows only (ram_rows, gguf_lora_rows below):
#       the RAM tier staged vs pageable vs pinned (GB/s and x resident on the bench Flux), and
#       GGUF + 0/1/4 LoRAs baked and per forward (bench/gguf_lora_paired.py: ComfyUI-GGUF's own
#       layers, so FERRY_COMFYUI and FERRY_COMFYUI_GGUF must name checkouts, and the gguf wheel
#       be carried in .whl/; without them the row says skipped and why).
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
case "$part" in all|tests|rows|bench|h2h|install) ;; *) echo "usage: bash tools/gpu_suite.sh [all|tests|rows|bench|h2h|install] [args]" >&2; exit 2 ;; esac

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
# The issue-41 rows: with a GPU at the bench Flux's size, without one at a tiny size (the dry run).
ram_modes=resident,ferry-block-pinned,ferry-block-ram,ferry-block-ram+pageable
if [ -n "$gpu" ]; then
  ram_args=(--model flux --tokens 1024 --txt-tokens 256 --layers 3 --single-layers 6 --dtype bf16 --forwards 3)
  gguf_args=(--device cuda --dtype bf16 --quants q8_0,q4_k --loras 1,4 --width 3072 --depth 4 --tokens 1024 --rounds 5)
else
  ram_args=(--model dit --size-gb 0.05 --tokens 64 --device cpu --forwards 1)  # no diffusers needed
  gguf_args=(--device cpu --quants q8_0 --loras 1 --width 256 --depth 2 --tokens 16 --rounds 2)
fi

rows() {  # the RAM tier staged/pageable/pinned, then GGUF + LoRAs baked and per forward
  local rc=0
  run ram-staging "$py" -m bench.compare --modes "$ram_modes" "${ram_args[@]}" \
    --workdir "${FERRY_BENCH_DIR:-/tmp/ferry-bench}" --out "$results/$stamp-ram-staging.md" || rc=1
  [ -n "${OUT:-}" ] && cp "$results/$stamp-ram-staging.md" "$OUT/" 2>/dev/null
  if [ -z "${FERRY_COMFYUI:-}" ] || [ -z "${FERRY_COMFYUI_GGUF:-}" ]; then
    echo "skipped gguf-lora: FERRY_COMFYUI or FERRY_COMFYUI_GGUF unset (ComfyUI-GGUF's layers are needed)"
  else
    FERRY_REPO=$PWD PYTHONPATH="$PWD/tests/comfyui/site:$PYTHONPATH" \
      run gguf-lora "${FERRY_COMFYUI_PYTHON:-$py}" -m bench.gguf_lora_paired "${gguf_args[@]}" || rc=1
  fi
  return "$rc"
}

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
  results=$(mktemp -d /tmp/ferry-gpu-suite-dry.XXXXXX)  # the dry run's logs: not bench/results
  FERRY_BENCH_DIR=${FERRY_BENCH_DIR:-$results/work}
  if [ "$part" = all ] || [ "$part" = tests ]; then
    echo "== cpu part: $py -m pytest tests/test_gpu.py tests/test_gguf_gpu.py tests/test_stream_ordering.py tests/test_stream_backend.py tests/test_staged_ram.py"
    "$py" -m pytest -q -p no:cacheprovider tests/test_gpu.py tests/test_gguf_gpu.py tests/test_stream_ordering.py tests/test_stream_backend.py tests/test_staged_ram.py || status=$?
  fi
  if [ "$part" = all ] || [ "$part" = tests ] || [ "$part" = rows ]; then
    rows || status=1
    rm -rf "$results/work"  # the tiny model's checkpoint; the logs stay in $results
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
if [ "$part" = all ] || [ "$part" = tests ] || [ "$part" = rows ]; then
  rows || status=1
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
