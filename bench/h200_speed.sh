#!/usr/bin/env bash
# Device call for issue 15 (timing at sweep speed), on nvidia-h200 with the base kit carried
# (pydantic, SQLAlchemy, alembic, cupti-python; ../shared/device/README.md):
#   check  cupti-python starts; per-batch cost of each activity source; the measure/run gpu tests
#   sweep  the first $LIMIT (1000) cases of gemm on GPU 0, end to end, and where the time went
#   profile  cProfile of a worker's loop over the first $LIMIT (400) gemm cases up to $SKIP_GFLOP GFLOP
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
  profile)
    timeout 300 python3 bench/profile_run.py gemm "${LIMIT:-400}" "${SKIP_GFLOP:-500}" > "$OUT/profile.txt" 2>&1
    head -75 "$OUT/profile.txt" | cut -c1-150 ;;
esac
