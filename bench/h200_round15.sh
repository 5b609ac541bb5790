#!/usr/bin/env bash
# Device calls of session 15 (benchmarks §23; the base and vllm kits carried, OPERATORX_GIT_SHA set):
#   gpu       the gpu tests of the code that runs on the GPU (bench/device_kit.sh gpu_tests), then the
#             torch MoE tests with expert-parallel shares (tests/backends/torch/test_moe_gpu.py)
#   upstream  the current upstream testlists (tests/spec/upstream/) through BACKENDS (default "torch vllm"):
#             single-device lists as they are, *_parallel lists once plainly (every split case must be
#             unsupported) and once with --rank-local; status counts per run in $OUT/summary.txt, the
#             runs' output in $OUT/upstream-logs.tgz. MAXT (default 0.3 s) caps each case's sampling: these runs count statuses.
set -uo pipefail
export PYTHONUNBUFFERED=1
. bench/device_kit.sh
counts() {
  python3 - "$@" <<'PY'
import collections, json, sqlite3, sys
db, label = sys.argv[1], sys.argv[2]
con = sqlite3.connect(db)
rows = [json.loads(r) for (r,) in con.execute("select record from ox_rows")]
by = collections.Counter(r["status"] for r in rows)
local = sum(1 for r in rows if "rank_local" in (r.get("metrics") or {}))
why = collections.Counter((r["status"], (r.get("message") or "")[:90]) for r in rows if r["status"] != "ok")
print(f"{label}: {len(rows)} rows: " + ", ".join(f"{k} {v}" for k, v in sorted(by.items())) + f"; rank_local {local}")
for (s, m), n in why.most_common(6):
    print(f"    {n:3d} {s}: {m}")
PY
}
case "${1:-gpu}" in
  gpu)
    gpu_tests
    echo "== torch moe gpu tests (expert-parallel shares among the variants)"
    timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider tests/backends/torch/test_moe_gpu.py \
      > "$OUT/moe_gpu_tests.txt" 2>&1
    grep -E "passed|failed|FAILED|ERROR" "$OUT/moe_gpu_tests.txt" | tail -8 ;;
  upstream)
    mkdir -p /tmp/logs
    for backend in ${BACKENDS:-torch vllm}; do
      for list in ${LISTS:-gemm_perf moe_layer_small moe_small gemm_parallel moe_parallel smoke_parallel attn_parallel}; do
        modes="plain"
        [[ "$list" == *_parallel ]] && modes="plain rank_local"
        for mode in $modes; do
          db="/tmp/$list-$backend-$mode.db"
          flag=""; [[ "$mode" == rank_local ]] && flag="--rank-local"
          timeout 400 python3 -m operatorx run -t "tests/spec/upstream/$list.json" --backend "$backend" $flag \
            --gpus 0 --max-time "${MAXT:-0.3}" --db "$db" --results-dir /tmp/res > "/tmp/logs/$list-$backend-$mode.txt" 2>&1
          echo "rc $?" >> "/tmp/logs/$list-$backend-$mode.txt"
          counts "$db" "$list $backend $mode" | tee -a "$OUT/summary.txt"
        done
      done
    done
    tar -czf "$OUT/upstream-logs.tgz" -C /tmp logs ;;
esac
