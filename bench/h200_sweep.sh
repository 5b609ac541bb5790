#!/usr/bin/env bash
# Device call for issues 11, 12-17 at the session's final commit, on nvidia-h200-x2 holding the
# carried vllm + base kits (../shared/device/README.md):
#   all gpu tests; Kimi-K2 block-FP8 GEMMs through vLLM; all of moe_small through vLLM on both GPUs
#   (`all`), or the gpu tests and moe_small's T=2048 layers (`final`). tests/web has no gpu tests
#   and needs the web stack, which the device kit does not carry.
set -uo pipefail
export PYTHONUNBUFFERED=1
if [ ! -f /tmp/site/.operatorx-kits ]; then
  (bash .device-kit/vllm-1/install.sh && bash .device-kit/base-1/install.sh) > "$OUT/install.txt" 2>&1 \
    && touch /tmp/site/.operatorx-kits
fi
export PYTHONPATH=/tmp/site:$PWD/src
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,power.draw,temperature.gpu --format=csv
run() { timeout "$1" python3 -m operatorx run --db /tmp/ox.db --results-dir /tmp/res "${@:2}" 2>&1 \
  | grep -v "Warning\|INFO\|warn"; }
case "${1:-all}" in
  tests)
    echo "== gpu tests"; timeout 240 python3 -m pytest -m gpu -q -p no:cacheprovider --ignore=tests/web tests 2>&1 | tail -12 ;;
  kimi)
    echo "== gemm_fp8 Kimi-K2 through vLLM"; run 150 -t gemm_fp8 --backend vllm --filter Kimi-K2 --gpus 0 ;;
  moe)
    echo "== moe_small through vLLM, both GPUs"; run 300 -t moe_small --backend vllm
    python3 -m operatorx results export latest --db /tmp/ox.db --format csv -o "$OUT/moe_small_vllm.csv" ;;
  moe2048)
    echo "== moe_small T=2048 layers through vLLM, both GPUs"; run 200 -t moe_small --backend vllm --filter T=2048
    python3 -m operatorx results export latest --db /tmp/ox.db --format csv -o "$OUT/moe2048_vllm.csv" ;;
  final)
    bash "$0" tests | tee "$OUT/tests.txt"; bash "$0" moe2048 | tee "$OUT/moe2048.txt"; cp /tmp/ox.db "$OUT/ox.db" ;;
  all)
    bash "$0" tests | tee "$OUT/tests.txt"; bash "$0" kimi | tee "$OUT/kimi.txt"; bash "$0" moe | tee "$OUT/moe.txt"
    cp /tmp/ox.db "$OUT/ox.db" ;;
esac
