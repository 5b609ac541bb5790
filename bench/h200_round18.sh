#!/usr/bin/env bash
# Device calls of session 18 (benchmarks §27; the vllm kit's seven chunks and the base kit carried,
# OPERATORX_GIT_SHA set):
#   carry  nothing but the chunk that came with the call
#   torch  the gpu tests of the code that runs on the GPU (bench/device_kit.sh gpu_tests), then the
#          multi-rank path at W=1 against the plain path through the torch backend, three rounds
#   attn   the shipped attn_small and upstream's attn_parallel through the torch backend (--rank-local)
#   vllm   the vllm backend's gpu tests, then the same W=1 check through the vllm backend (vLLM's
#          parallel state on the group, RowParallelLinear / ColumnParallelLinear / FusedMoE), three rounds
set -uo pipefail
export PYTHONUNBUFFERED=1
case "${1:-carry}" in
  carry)
    ls .device-kit ;;
  smoke)
    . bench/device_kit.sh
    tail -2 "$OUT/install.txt"
    echo "== W=1 vllm, one round"
    timeout 250 python3 bench/rank_w1.py --device cuda --backend vllm --rounds 1 --out "$OUT/smoke_vllm.json" \
      > "$OUT/smoke_vllm.txt" 2>&1; echo "rc $?"; grep -v "Warning\|INFO\|warn" "$OUT/smoke_vllm.txt" | tail -25
    echo "== W=1 torch, one round"
    timeout 120 python3 bench/rank_w1.py --device cuda --rounds 1 2>&1 | tail -5 ;;
  torch)
    . bench/device_kit.sh
    tail -3 "$OUT/install.txt"
    gpu_tests
    echo "== multi-rank W=1 against the plain path (torch)"
    timeout 200 python3 bench/rank_w1.py --device cuda --rounds 3 --out "$OUT/rank_w1_torch.json" 2>&1 | tail -8 ;;
  attn)
    . bench/device_kit.sh
    echo "== attn_small through torch"
    timeout 300 python3 -m operatorx run -t attn_small --backend torch --rank-local --db "$OUT/attn.db" \
      --results-dir "$OUT/res" > "$OUT/attn.txt" 2>&1; echo "rc $?"; grep -v "Warning" "$OUT/attn.txt" | tail -30
    echo "== upstream attn_parallel through torch, rank-local"
    timeout 250 python3 -m operatorx run -t tests/spec/upstream/attn_parallel.json --backend torch --rank-local \
      --db "$OUT/attn.db" --results-dir "$OUT/res" > "$OUT/attn_up.txt" 2>&1; echo "rc $?"
    grep -v "Warning" "$OUT/attn_up.txt" | tail -8 ;;
  vllm)
    . bench/device_kit.sh
    echo "== vllm gpu tests"
    timeout 300 python3 -m pytest tests/backends/vllm -m gpu -q -p no:cacheprovider > "$OUT/tests_vllm.txt" 2>&1
    grep -E "passed|failed|FAILED|ERROR" "$OUT/tests_vllm.txt" | tail -15
    echo "== multi-rank W=1 against the plain path (vllm)"
    timeout 250 python3 bench/rank_w1.py --device cuda --backend vllm --rounds 3 --out "$OUT/rank_w1_vllm.json" \
      2>&1 | grep -v "Warning\|INFO\|warn" | tail -12 ;;
esac
