#!/usr/bin/env bash
# Device calls of session 16 (benchmarks §25; the base and pyd kits carried, OPERATORX_GIT_SHA set):
#   gpu        the gpu tests of the code that runs on the GPU (bench/device_kit.sh gpu_tests)
#   placement  bench/lists/probe15.json four times (--placements 1 and 3, each plainly and with --host, so
#              the operands are allocated in another order), the agreement of each pair case by case
#              (bench/run_agreement.py) and each case's placement spread; then ab on the same list:
#              torch vs torch, torch vs py:F.linear (identical code), torch vs F.linear + a 2% spin
#   final      the gpu tests, then the multi-rank path at W=1 against the plain path (bench/rank_w1.py),
#              then the three ab runs of `placement` again (the verdict band as committed), and the
#              probe list with --host: each case's host time, its batch spread, host_bound or why not
#   planted    the planted-slowdown ab alone (its spin sized once per case), and the probe list with --host
#   cost       the first LIMIT (default 1000) cases of `gemm` with --placements 1 and 3: cases/s
set -uo pipefail
export PYTHONUNBUFFERED=1
. bench/device_kit.sh
L=bench/lists/probe15.json
case "${1:-gpu}" in
  gpu)
    gpu_tests ;;
  final)
    gpu_tests
    echo "== multi-rank W=1 against the plain path"
    timeout 240 python3 bench/rank_w1.py --device cuda --rounds 3 --out "$OUT/rank_w1.json" 2>&1 | tail -12
    for b in torch "py:bench/planted.py:linear" "py:bench/planted.py:slower[pct=2]"; do
      tag=$(echo "$b" | tr -c 'a-z0-9\n' '_')
      timeout 300 python3 -m operatorx ab --a torch --b "$b" -t "$L" --gpus 0 --db "/tmp/ab-$tag.db" \
        --results-dir /tmp/res > "$OUT/ab-$tag.txt" 2>&1; echo "rc $?" >> "$OUT/ab-$tag.txt"
      echo "== ab torch vs $b"
      python3 bench/placement_report.py "/tmp/ab-$tag.db" --ab 2>&1 | tee "$OUT/ab-report-$tag.txt"
    done ;;
  planted)
    b="py:bench/planted.py:slower[pct=2]"
    timeout 300 python3 -m operatorx ab --a torch --b "$b" -t "$L" --gpus 0 --db /tmp/ab-planted.db \
      --results-dir /tmp/res > "$OUT/ab-planted.txt" 2>&1; echo "rc $?" >> "$OUT/ab-planted.txt"
    echo "== ab torch vs $b"
    python3 bench/placement_report.py /tmp/ab-planted.db --ab 2>&1
    echo "== host time, stable or why not (--host, one placement)"
    timeout 200 python3 -m operatorx run -t "$L" --gpus 0 --host --db /tmp/host.db --results-dir /tmp/res \
      > "$OUT/host.txt" 2>&1
    python3 bench/placement_report.py /tmp/host.db 2>&1 ;;
  placement)
    for n in 1 3; do
      for host in plain host; do
        flag=""; [[ "$host" == host ]] && flag="--host"
        timeout 300 python3 -m operatorx run -t "$L" --gpus 0 --placements "$n" $flag --db "/tmp/p$n-$host.db" \
          --results-dir /tmp/res > "$OUT/probe-p$n-$host.txt" 2>&1; echo "rc $?" >> "$OUT/probe-p$n-$host.txt"
        python3 bench/placement_report.py "/tmp/p$n-$host.db" > "$OUT/spread-p$n-$host.txt" 2>&1
      done
      echo "== placements $n: plain against --host"
      python3 bench/run_agreement.py "/tmp/p$n-plain.db:latest" "/tmp/p$n-host.db:latest" 2>&1 | tail -6
    done
    cat "$OUT/spread-p3-plain.txt"; echo "== host time (--placements 1, --host)"; cat "$OUT/spread-p1-host.txt"
    for b in torch "py:bench/planted.py:linear" "py:bench/planted.py:slower[pct=2]"; do
      tag=$(echo "$b" | tr -c 'a-z0-9\n' '_')
      timeout 400 python3 -m operatorx ab --a torch --b "$b" -t "$L" --gpus 0 --db "/tmp/ab-$tag.db" \
        --results-dir /tmp/res > "$OUT/ab-$tag.txt" 2>&1; echo "rc $?" >> "$OUT/ab-$tag.txt"
      echo "== ab torch vs $b"
      python3 bench/placement_report.py "/tmp/ab-$tag.db" --ab 2>&1 | tee "$OUT/ab-report-$tag.txt"
    done
    echo "== host time, stable or why not (--host, one placement)"
    timeout 200 python3 -m operatorx run -t "$L" --gpus 0 --host --db /tmp/host.db --results-dir /tmp/res \
      > "$OUT/host.txt" 2>&1
    python3 bench/placement_report.py /tmp/host.db 2>&1 | tee "$OUT/host-report.txt" ;;
  cost)
    for n in 1 3; do
      t0=$(date +%s.%N)
      timeout 560 python3 -m operatorx run -t gemm --limit "${LIMIT:-1000}" --gpus 0 --placements "$n" \
        --db "/tmp/cost-$n.db" --results-dir /tmp/res > "$OUT/cost-$n.txt" 2>&1
      rc=$?; t1=$(date +%s.%N)
      echo "placements $n: rc $rc, $(python3 -c "print(f'{$t1-$t0:.1f} s wall, {${LIMIT:-1000}/($t1-$t0):.2f} cases/s')")"
      tail -4 "$OUT/cost-$n.txt"
    done ;;
esac
