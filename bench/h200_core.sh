#!/usr/bin/env bash
# One device call on the H200: install the carried base wheels, run the gpu tests and the core
# torch benchmarks. Everything goes to $OUT/log.txt (plus the database and result documents).
set -uo pipefail
bash .device-kit/base-1/install.sh >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
log=$OUT/log.txt
{
  date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
  echo "== gpu tests (torch backends, measure, run)"
  python3 -m pytest -q -m gpu tests/backends/torch tests/measure tests/run -p no:cacheprovider 2>&1 | tail -40
  for tl in "$@"; do
    echo "== operatorx run -t $tl"
    python3 -m operatorx run -t "$tl" --db "$OUT/ox.db" --results-dir "$OUT/res" $EXTRA 2>&1 | grep -v Warning
  done
} 2>&1 | tee -a "$log"
