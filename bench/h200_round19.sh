#!/usr/bin/env bash
# Device calls of session 19 (benchmarks §28; OPERATORX_GIT_SHA set):
#   carry  nothing but the chunk that came with the call (the vllm kit's chunks, back to back)
#   torch  the gpu tests of the code that runs on the GPU (bench/device_kit.sh gpu_tests, the torch
#          attention backend's among them), then the shipped attn_small and upstream's attn_parallel
#          through the torch backend (--rank-local), and attn_small's rows printed
#   vllm   the vllm backend's gpu tests (its attention tests among them), then attn_small and upstream's
#          attn_parallel through the vllm backend (--rank-local)
#   step   vLLM's engine (the engine kit too) on a two-layer Llama-3.1-8B, then its decode step at
#          batch 1, 16, 64 (bench/step_check.py), for MODEL (default llama-3.1-8b) and CTX (default 1024)
set -uo pipefail
export PYTHONUNBUFFERED=1
attn_runs() {   # backend
  echo "== attn_small through $1"
  timeout 220 python3 -m operatorx run -t attn_small --backend "$1" --rank-local --db "$OUT/attn_$1.db" \
    --results-dir "$OUT/res_$1" > "$OUT/attn_small_$1.txt" 2>&1; echo "rc $?"
  grep -v "Warning\|INFO\|warn" "$OUT/attn_small_$1.txt" | tail -22
  echo "== upstream attn_parallel through $1, rank-local"
  timeout 120 python3 -m operatorx run -t tests/spec/upstream/attn_parallel.json --backend "$1" --rank-local \
    --db "$OUT/attn_$1.db" --results-dir "$OUT/res_$1" > "$OUT/attn_up_$1.txt" 2>&1; echo "rc $?"
  grep -v "Warning\|INFO\|warn" "$OUT/attn_up_$1.txt" | tail -6
}
case "${1:-carry}" in
  carry)
    ls .device-kit ;;
  torch)
    . bench/device_kit.sh
    tail -2 "$OUT/install.txt"
    gpu_tests
    attn_runs torch ;;
  vllm)
    . bench/device_kit.sh
    tail -2 "$OUT/install.txt"
    echo "== vllm gpu tests"
    timeout 300 python3 -m pytest tests/backends/vllm -m gpu -q -p no:cacheprovider > "$OUT/tests_vllm.txt" 2>&1
    grep -E "passed|failed|FAILED|ERROR" "$OUT/tests_vllm.txt" | tail -15
    attn_runs vllm ;;
  step)
    . bench/device_kit.sh
    tail -2 "$OUT/install.txt"
    export VLLM_ENABLE_V1_MULTIPROCESSING=0
    model=${MODEL:-llama-3.1-8b}; ctx=${CTX:-1024}
    if [ -n "${SMOKE:-}" ]; then
      echo "== engine smoke: two layers"
      timeout 200 python3 bench/step_check.py --model "$model" --layers 2 --batch 1 --reps 1 \
        --out "$OUT/step_smoke.json" > "$OUT/step_smoke.txt" 2>&1; echo "rc $?"
      grep -v "Warning\|INFO\|warn" "$OUT/step_smoke.txt" | tail -25
    fi
    echo "== decode step $model ctx $ctx"
    timeout 420 python3 bench/step_check.py --model "$model" --batch 1 16 64 --ctx "$ctx" \
      --out "$OUT/step_${model}_$ctx.json" > "$OUT/step_${model}_$ctx.txt" 2>&1; echo "rc $?"
    grep -v "Warning\|INFO\|warn" "$OUT/step_${model}_$ctx.txt" | tail -30 ;;
esac
