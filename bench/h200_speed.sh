#!/usr/bin/env bash
# Device call for issue 15 (timing at sweep speed), on nvidia-h200 with the base kit carried
# (pydantic, SQLAlchemy, alembic, cupti-python; ../shared/device/README.md):
#   check  cupti-python starts; per-batch cost of each activity source; the measure/run gpu tests
#   sweep  the first $LIMIT (1000) cases of gemm on GPU 0, end to end, and where the time went
set -uo pipefail
export PYTHONUNBUFFERED=1
if [ ! -f /tmp/site/.operatorx-base ]; then
  bash .device-kit/base-1/install.sh > "$OUT/install.txt" 2>&1 && touch /tmp/site/.operatorx-base
fi
export PYTHONPATH=/tmp/site:$PWD/src
case "${1:-check}" in
  check)
    nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,power.draw,temperature.gpu --format=csv
    python3 -c "from cupti import cupti; print('cupti-python ok', cupti.get_timestamp())" 2>&1 | tail -2
    echo "== activity cost"; timeout 120 python3 bench/activity_cost.py 2>&1 | tail -4
    echo "== gpu tests (measure, run)"
    timeout 240 python3 -m pytest -m gpu -q -p no:cacheprovider tests/measure tests/run 2>&1 | tail -8 ;;
  sweep)
    timeout 500 python3 bench/sweep_scaling.py --testlist gemm --limit "${LIMIT:-1000}" --gpus 0 \
      --db /tmp/speed.db --json "$OUT/speed.json" 2>&1 | tail -30
    cp /tmp/speed.db "$OUT/speed.db" 2>/dev/null ;;
esac
