#!/usr/bin/env bash
# Device calls of session 21 (benchmarks §30), each inside one call's 600 s (OPERATORX_GIT_SHA set):
#   carry      nothing but the chunk that came with the call (vllm-1..7, engine-1..4, base-1, back to back)
#   attn       the vllm attention gpu tests: gqa (the graph decode's split budget), mla, gdn/kda, mla_dsa
#   layers     the rest of the vllm gpu tests (gemm, MoE, ranks at W=1)
#   lists      attn_small (its gdn cases too) and upstream attn_parallel (--rank-local) through vllm;
#              bench/torch_mla_fp8_probe.py (which block-FP8 GEMM cuBLASLt refuses)
#   akc        bench/attn_kernel_check.py (AKC_ARGS adds its options)
# Sequence: 12 carry calls, the last carrying vllm-7 + engine-4 + base-1 and running `attn`; then
# `layers`, `lists`, `akc` back to back (each < 30 s apart, or the machine is given back).
set -uo pipefail
export PYTHONUNBUFFERED=1
summary() {   # pytest log -> its verdict lines
  grep -E "passed|failed|FAILED|XPASS|XFAIL|^E " "$1" | tail -40
}
case "${1:-carry}" in
  carry)
    ls .device-kit ;;
  attn)
    . bench/device_kit.sh
    tail -1 "$OUT/install.txt"
    timeout 520 python3 -m pytest -m gpu -q -p no:cacheprovider --tb=short -rxX tests/backends/vllm/test_attention.py \
      tests/backends/vllm/test_attention_mla.py tests/backends/vllm/test_attention_linear.py \
      tests/backends/vllm/test_attention_dsa.py > "$OUT/tests_vllm_attn.txt" 2>&1
    summary "$OUT/tests_vllm_attn.txt" ;;
  layers)
    . bench/device_kit.sh
    timeout 570 python3 -m pytest -m gpu -q -p no:cacheprovider --tb=short tests/backends/vllm/test_gpu.py \
      tests/backends/vllm/test_ranks.py > "$OUT/tests_vllm_layers.txt" 2>&1
    summary "$OUT/tests_vllm_layers.txt" ;;
  lists)
    . bench/device_kit.sh
    for list in attn_small tests/spec/upstream/attn_parallel.json; do
      name=$(basename "$list" .json)
      timeout 200 python3 -m operatorx run -t "$list" --backend vllm --rank-local --db "$OUT/attn_vllm.db" \
        --results-dir "$OUT/res_vllm" > "$OUT/run_${name}_vllm.txt" 2>&1
      echo "$name vllm rc $?: $(tail -1 "$OUT/run_${name}_vllm.txt")"
    done
    timeout 90 python3 bench/torch_mla_fp8_probe.py > "$OUT/mla_fp8_probe.txt" 2>&1
    echo "probe rc $?"; cut -c1-600 "$OUT/mla_fp8_probe.txt" | tail -12 ;;
  akc)
    . bench/device_kit.sh
    timeout 560 python3 bench/attn_kernel_check.py --out "$OUT/akc.json" ${AKC_ARGS:-} > "$OUT/akc.txt" 2>&1
    echo "rc $?"
    grep -A10 "^| shape" "$OUT/akc.txt" ;;
esac
