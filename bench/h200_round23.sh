#!/usr/bin/env bash
# Device calls of session 22 (benchmarks §30), each inside one call's 600 s (OPERATORX_GIT_SHA set):
#   carry   nothing but the chunk that came with the call (vllm-1..7, engine-1..4, base-1, back to back)
#   final   why gdn's mixed batch fails (--runxfail), the mla_dsa and torch attention gpu tests, then
#           attn_small through vllm and torch
#   attn2   the vllm gqa and mla attention gpu tests; bench/attn_kernel_check.py when time is left
set -uo pipefail
export PYTHONUNBUFFERED=1
case "${1:-carry}" in
  carry)
    ls .device-kit ;;
  final)
    . bench/device_kit.sh
    tail -1 "$OUT/install.txt"
    timeout 120 python3 -m pytest -m gpu -q -p no:cacheprovider --tb=long --runxfail -x \
      "tests/backends/vllm/test_attention_linear.py::test_gdn_mixed_batch_matches_the_reference" \
      > "$OUT/tests_gdn_mixed.txt" 2>&1
    grep -E "Error|error|passed|failed" "$OUT/tests_gdn_mixed.txt" | grep -v "^  " | tail -12 | cut -c1-400
    timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider --tb=short tests/backends/vllm/test_attention_dsa.py \
      tests/backends/torch/test_attention_gpu.py > "$OUT/tests_dsa_torch.txt" 2>&1
    summary "$OUT/tests_dsa_torch.txt"
    for backend in vllm torch; do
      timeout 110 python3 -m operatorx run -t attn_small --backend "$backend" --rank-local --db "$OUT/attn.db" \
        --results-dir "$OUT/res_$backend" > "$OUT/run_attn_small_$backend.txt" 2>&1
      echo "attn_small $backend rc $?: $(tail -1 "$OUT/run_attn_small_$backend.txt")"
    done ;;
  attn2)
    . bench/device_kit.sh
    timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider --tb=short tests/backends/vllm/test_attention.py \
      tests/backends/vllm/test_attention_mla.py > "$OUT/tests_vllm_gqa_mla.txt" 2>&1
    summary "$OUT/tests_vllm_gqa_mla.txt"
    timeout 250 python3 bench/attn_kernel_check.py --out "$OUT/akc.json" ${AKC_ARGS:-} > "$OUT/akc.txt" 2>&1
    echo "akc rc $?"
    grep -A10 "^| shape" "$OUT/akc.txt" ;;
esac
