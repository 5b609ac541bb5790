#!/usr/bin/env bash
# Device calls prepared for the session after 20 (benchmarks §29's open items), each inside one call's
# 600 s (OPERATORX_GIT_SHA set):
#   carry      nothing but the chunk that came with the call (vllm-1..7, engine-1..4, base-1, back to back)
#   attn       the attention gpu tests: vllm gqa, mla, block-FP8 projections, gdn/kda (linear) and mla_dsa
#              first cuts (xfail until they pass), torch attention
#   layers     the rest of the vllm gpu tests (gemm, MoE, ranks at W=1), which need their own call
#   lists      attn_small and upstream attn_parallel through vllm and torch (--rank-local), statuses counted
#   akc        bench/attn_kernel_check.py (AKC_ARGS adds its options)
# Sequence: 12 carry calls, the last carrying vllm-7 + engine-4 + base-1 and running `attn`; then
# `layers`, `lists`, `akc` back to back (each < 30 s apart, or the machine is given back).
set -uo pipefail
export PYTHONUNBUFFERED=1
summary() {   # pytest log -> its verdict lines
  grep -E "passed|failed|FAILED|XPASS|^E " "$1" | tail -30
}
case "${1:-carry}" in
  carry)
    ls .device-kit ;;
  attn)
    . bench/device_kit.sh
    tail -1 "$OUT/install.txt"
    timeout 330 python3 -m pytest -m gpu -q -p no:cacheprovider --tb=short -rxX tests/backends/vllm/test_attention.py \
      tests/backends/vllm/test_attention_mla.py tests/backends/vllm/test_attention_linear.py \
      tests/backends/vllm/test_attention_dsa.py > "$OUT/tests_vllm_attn.txt" 2>&1
    summary "$OUT/tests_vllm_attn.txt"
    timeout 120 python3 -m pytest -m gpu -q -p no:cacheprovider --tb=short tests/backends/torch/test_attention_gpu.py \
      > "$OUT/tests_torch_attn.txt" 2>&1
    summary "$OUT/tests_torch_attn.txt" ;;
  layers)
    . bench/device_kit.sh
    timeout 560 python3 -m pytest -m gpu -q -p no:cacheprovider --tb=short tests/backends/vllm/test_gpu.py \
      tests/backends/vllm/test_ranks.py > "$OUT/tests_vllm_layers.txt" 2>&1
    summary "$OUT/tests_vllm_layers.txt" ;;
  lists)
    . bench/device_kit.sh
    for backend in vllm torch; do
      for list in attn_small tests/spec/upstream/attn_parallel.json; do
        name=$(basename "$list" .json)
        timeout 200 python3 -m operatorx run -t "$list" --backend "$backend" --rank-local --db "$OUT/attn_$backend.db" \
          --results-dir "$OUT/res_$backend" > "$OUT/run_${name}_$backend.txt" 2>&1
        echo "$name $backend rc $?: $(tail -1 "$OUT/run_${name}_$backend.txt")"
      done
    done ;;
  akc)
    . bench/device_kit.sh
    timeout 560 python3 bench/attn_kernel_check.py --out "$OUT/akc.json" ${AKC_ARGS:-} > "$OUT/akc.txt" 2>&1
    echo "rc $?"
    grep -A10 "^| shape" "$OUT/akc.txt" ;;
esac
