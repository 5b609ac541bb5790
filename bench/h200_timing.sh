#!/usr/bin/env bash
# Issue 7 on the H200, in one device call: gpu tests of measure/, the accuracy benchmark (ours,
# cupti-python reference, ncu), and a throughput run over a gemm list. Needs the base and cupti kits.
set -uo pipefail
bash .device-kit/base-1/install.sh >/dev/null 2>&1
bash .device-kit/cupti2-1/install.sh >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
log=$OUT/log.txt
{
  date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
  ncu --version | tail -1
  if [[ "${SKIP_TESTS:-0}" != 1 ]]; then
    echo "== gpu tests (measure, run)"
    python3 -m pytest -q -m gpu tests/measure tests/run -p no:cacheprovider 2>&1 | tail -25
  fi
  echo "== ours"; python3 bench/timing_accuracy.py ours "$OUT" 2>&1 | grep -v Warning
  echo "== cupti reference"; python3 bench/timing_accuracy.py cupti "$OUT" 2>&1 | grep -v Warning | tail -3
  if [[ "${SKIP_NCU:-0}" != 1 ]]; then
    echo "== ncu"
    ncu --clock-control none --cache-control all --nvtx --nvtx-include "regex:ox.acc/" \
        --metrics gpu__time_duration.sum --csv --page raw --log-file "$OUT/ncu.csv" \
        python3 bench/timing_accuracy.py ncu-child >/dev/null 2>"$OUT/ncu.err"; echo "ncu rc $?"; tail -3 "$OUT/ncu.err"
  fi
  echo "== table"; python3 bench/timing_accuracy.py table "$OUT" "$OUT/ncu.csv"
  if [[ -n "${RATE_LIST:-}" ]]; then
    echo "== cases/s over $RATE_LIST (limit ${RATE_LIMIT:-300})"
    /usr/bin/time -f "wall %e s" python3 -m operatorx run -t "$RATE_LIST" --limit "${RATE_LIMIT:-300}" \
        --db "$OUT/rate.db" --results-dir "$OUT/res" 2>&1 | tail -4
  fi
} 2>&1 | tee -a "$log"
