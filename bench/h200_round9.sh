#!/usr/bin/env bash
# Session 9's closing device call (nvidia-h200-x2, the base kit carried; OPERATORX_GIT_SHA set):
#   the gpu tests of measure, run, platform and the torch backends, then the first $LIMIT (1000) gemm
#   cases on GPU 0 and on GPUs 0,1 (h200_round6.sh final), a second one-GPU sweep (is the speed
#   repeatable? SKIP_AGAIN=1 leaves it out), and the accuracy set's two kernels passes, a second process's pass and the
#   independent CUPTI reference (h200_round6.sh accuracy).
set -uo pipefail
export PYTHONUNBUFFERED=1
bash bench/h200_round6.sh final
[ -n "${SKIP_AGAIN:-}" ] || { echo "== one GPU again"
PYTHONPATH=/tmp/site:$PWD/src timeout 200 python3 bench/sweep_scaling.py --testlist gemm --limit "${LIMIT:-1000}" \
  --gpus 0 --db /tmp/speed2.db --json "$OUT/speed2.json" --cases-csv "$OUT/cases2.csv" 2>&1 \
  | grep -E "cases in|case phase|between cases|start-up|retried"; }
ACC_PASSES=kernels_1,kernels_2 bash bench/h200_round6.sh accuracy
