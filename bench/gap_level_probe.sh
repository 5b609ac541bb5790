#!/usr/bin/env bash
# The launch-gap level of fresh processes (issue 15, benchmarks §17-18): each process times fp8_0
# (1x10240x8192 dynamic-quant FP8, ten kernels a call) once; its span minus busy time is the GPU's idle
# time between the call's kernels. Run as many processes under each environment given, e.g.
#   PROBE_RUNS=5 bash bench/gap_level_probe.sh "" "CUDA_DEVICE_MAX_CONNECTIONS=1"
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
for setting in "$@"; do
  line="${setting:-default}:"
  for i in $(seq "${PROBE_RUNS:-5}"); do
    dir=$(mktemp -d)
    env $setting ACC_CASES=fp8_0 ACC_PASSES=kernels_1 timeout 120 python3 bench/timing_accuracy.py ours "$dir" \
      >/dev/null 2>&1
    line+=$(python3 -c "
import json, sys
r = json.load(open('$dir/ours.json'))['passes']['kernels_1']['rows']['fp8_0']
print(f\" {r['latency_us'] - r['busy_us']:.2f}\", end='')" 2>/dev/null || echo " -")
  done
  echo "$line"
done
