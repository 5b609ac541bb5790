#!/usr/bin/env bash
# Device calls of session 12 (the base kit carried, OPERATORX_GIT_SHA set):
#   single    (nvidia-h200) what a worker's imports cost on the image as found and with a bytecode
#             cache tree (bench/pycache_probe.sh); the parent's time to its first spawn
#             (bench/parent_start.py); the gpu tests of measure, run, platform and the torch backends;
#             then the first 1,000 gemm cases on GPU 0 (h200_round6.sh speed without the activity cost)
#   scaling   (nvidia-h200-x2) the first 1,000 gemm cases on GPU 0 and on GPUs 0,1
#   accuracy  the accuracy set's two kernels passes, a second process and the reference
set -uo pipefail
export PYTHONUNBUFFERED=1
. bench/device_kit.sh
case "${1:-single}" in
  single)
    echo "== imports: as found, then a cache tree"
    timeout 90 bash bench/pycache_probe.sh 3 2>&1 | tail -8
    echo "== parent: start to first spawn (bytecode cache: ${OPERATORX_BYTECODE_CACHE:-on})"
    timeout 120 python3 bench/parent_start.py --repeats 5 --device cuda 2>&1 | tail -2
    SKIP_COST=1 TESTS="tests/measure tests/run tests/platform tests/backends/torch" \
      bash bench/h200_round6.sh speed 2>&1 | grep -v "^    \|^  span (timed\|^  busy (timed" ;;
  scaling)
    bash bench/h200_round6.sh scaling 2>&1 | grep -v "^    \|^  span (timed\|^  busy (timed" ;;
  accuracy)
    ACC_PASSES=kernels_1,kernels_2 bash bench/h200_round6.sh accuracy ;;
esac
