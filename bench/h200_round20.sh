#!/usr/bin/env bash
# Device calls of session 20 (benchmarks §29; OPERATORX_GIT_SHA set):
#   carry  nothing but the chunk that came with the call (the kits' chunks, back to back)
#   tests  the vllm backend's gpu tests (gqa, mla, their block-FP8 projections, the MoE checks) and the
#          torch attention gpu tests (TEST_ARGS adds pytest options)
#   lists  attn_small and upstream's attn_parallel through the vllm and the torch backend (--rank-local);
#          the rows' statuses and reasons counted
#   akc    bench/attn_kernel_check.py: the attention kernel inside the vllm gqa rows against FA3 called
#          directly and FlashInfer's paged attention (AKC_ARGS adds its options)
#   step   Qwen3-30B-A3B's serving scenario (ISL 960, OSL 128) at concurrency 1, 16, 64 through the vllm
#          backend and its step estimate, to hold against vLLM's engine step of §28
set -uo pipefail
export PYTHONUNBUFFERED=1
statuses() {   # db -> one line per (op type, status, reason head)
  python3 - "$1" <<'PY'
import sqlite3, sys
con = sqlite3.connect(sys.argv[1])
q = ("select op_type, status, substr(coalesce(message, ''), 1, 110), count(*) from ox_rows "
     "group by 1, 2, 3 order by 1, 2, 3")
for t, s, m, n in con.execute(q):
    print(f"{n:4d} {t} {s} {m}")
for label, lat, busy in con.execute("select label, latency_us, busy_us from ox_rows where status = 'ok' "
                                    "order by id"):
    print(f"  {label}: {lat} / {busy} us")
PY
}
case "${1:-carry}" in
  carry)
    ls .device-kit ;;
  tests)
    . bench/device_kit.sh
    tail -2 "$OUT/install.txt"
    echo "== vllm gpu tests"
    timeout 380 python3 -m pytest tests/backends/vllm -m gpu -q -p no:cacheprovider ${TEST_ARGS:-} \
      > "$OUT/tests_vllm.txt" 2>&1
    grep -E "passed|failed|FAILED|ERROR" "$OUT/tests_vllm.txt" | tail -20
    echo "== torch attention gpu tests"
    timeout 120 python3 -m pytest tests/backends/torch/test_attention_gpu.py -m gpu -q -p no:cacheprovider \
      > "$OUT/tests_torch_attn.txt" 2>&1
    grep -E "passed|failed|FAILED|ERROR" "$OUT/tests_torch_attn.txt" | tail -8 ;;
  lists)
    . bench/device_kit.sh
    for backend in vllm torch; do
      for list in attn_small tests/spec/upstream/attn_parallel.json; do
        name=$(basename "$list" .json)
        echo "== $name through $backend, rank-local"
        timeout 200 python3 -m operatorx run -t "$list" --backend "$backend" --rank-local --db "$OUT/attn_$backend.db" \
          --results-dir "$OUT/res_$backend" > "$OUT/run_${name}_$backend.txt" 2>&1; echo "rc $?"
        grep -v "Warning\|INFO\|warn" "$OUT/run_${name}_$backend.txt" | tail -3
      done
      statuses "$OUT/attn_$backend.db"
    done ;;
  akc)
    . bench/device_kit.sh
    timeout 560 python3 bench/attn_kernel_check.py --out "$OUT/akc.json" ${AKC_ARGS:-} > "$OUT/akc.txt" 2>&1
    echo "rc $?"
    grep -v "Warning\|INFO\|warn" "$OUT/akc.txt" | tail -40 ;;
  step)
    . bench/device_kit.sh
    model=Qwen/Qwen3-30B-A3B-Base
    for conc in ${CONC:-1 16 64}; do
      echo "== $model conc $conc"
      python3 -m operatorx testlist serving --model "$model" --isl 960 --osl 128 --conc "$conc" \
        -o "$OUT/scen_$conc.json" > /dev/null
      timeout 150 python3 -m operatorx run -t "$OUT/scen_$conc.json" --backend vllm --db "$OUT/step.db" \
        --results-dir "$OUT/res_step" > "$OUT/step_run_$conc.txt" 2>&1; echo "rc $?"
      python3 -m operatorx estimate latest --scenario "$OUT/scen_$conc.json" --db "$OUT/step.db" 2>&1 | tail -25
    done ;;
esac
