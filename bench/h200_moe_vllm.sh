#!/usr/bin/env bash
# Device calls for issues 3 and 6 on a machine that holds the carried vllm + base kits.
#   bench/h200_moe_vllm.sh moe    : vLLM gpu tests, moe_small through torch, MoE stage profile
#   bench/h200_moe_vllm.sh vllm   : vllm vs torch side by side (gemm_perf, gemm_fp8, MoE layers)
#   bench/h200_moe_vllm.sh verify : all gpu tests, and vllm host layers on three block-fp8 decode GEMMs
set -uo pipefail
export PYTHONUNBUFFERED=1
if [ ! -f /tmp/site/.operatorx-kits ]; then
  (bash .device-kit/vllm-1/install.sh && bash .device-kit/base-1/install.sh) > "$OUT/install.txt" 2>&1 \
    && touch /tmp/site/.operatorx-kits
fi
export PYTHONPATH=/tmp/site:$PWD/src
log=$OUT/log_$1.txt
case "$1" in
  moe)
    { echo "== vllm gpu tests"; timeout 110 python3 -m pytest tests/backends/vllm -m gpu -q -p no:cacheprovider 2>&1 | tail -15
      echo "== operatorx run -t moe_small --backend torch"
      timeout 200 python3 -m operatorx run -t moe_small --backend torch --db "$OUT/moe.db" --results-dir "$OUT/res" 2>&1 | grep -v Warning
      echo "== bench/moe_profile.py"
      timeout 180 python3 bench/moe_profile.py --tokens 1,64,2048 --distributions natural,balanced 2>&1 | tail -60
    } 2>&1 | tee "$log" ;;
  verify)
    { echo "== gpu tests"; timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests 2>&1 | tail -6
      echo "== operatorx run -t gemm_fp8 --backend vllm --host --filter o_proj"
      timeout 120 python3 -m operatorx run -t gemm_fp8 --backend vllm --host --filter o_proj --db "$OUT/v.db" \
        --results-dir "$OUT/res" 2>&1 | grep -v "Warning\|INFO"
    } 2>&1 | tee "$log" ;;
  vllm)
    timeout 560 python3 bench/vllm_side_by_side.py 2>&1 | grep -v "Warning\|INFO\|warn" | tee "$log" ;;
esac
