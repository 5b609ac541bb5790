#!/usr/bin/env bash
# Device call of session 17 (benchmarks §26; the base kit carried, OPERATORX_GIT_SHA set):
#   final  the gpu tests of the code that runs on the GPU (bench/device_kit.sh gpu_tests), then the
#          multi-rank path at W=1 against the plain path, three rounds (bench/rank_w1.py)
set -uo pipefail
export PYTHONUNBUFFERED=1
. bench/device_kit.sh
case "${1:-final}" in
  final)
    gpu_tests
    echo "== multi-rank W=1 against the plain path"
    timeout 200 python3 bench/rank_w1.py --device cuda --rounds 3 --out "$OUT/rank_w1.json" 2>&1 | tail -12 ;;
esac
