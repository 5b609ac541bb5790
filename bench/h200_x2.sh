#!/usr/bin/env bash
# Device calls of issue 34 on nvidia-h200-x2 (two H200s of one host; the base kit and the vllm kit's seven
# chunks carried, OPERATORX_GIT_SHA set). Each mode fits one call (< 600 s, every step under `timeout`):
#   carry   nothing but the chunk that came with the call (the kit's chunks, back to back)
#   torch   the host's GPUs and links (nvidia-smi), the gpu tests of the multi-rank path over two GPUs
#           (tests/run/test_ranks_gpu.py, tests/run/test_ranks_gpu2.py, tests/backends/torch/test_collective_gpu.py;
#           FULL=1: bench/device_kit.sh gpu_tests, every gpu test of the code that runs on the GPU), then
#           upstream's gemm_parallel, moe_parallel and smoke_parallel cases with tp·dp <= 2
#           (bench/parallel_lists.py write) through the torch backend on both GPUs (--gpus 0,1), and their
#           rows audited (bench/parallel_lists.py audit: counts, error rows, unsupported reasons, skew and
#           per-rank telemetry of every multi-rank ok row)
#   check   bench/tp2_check.py through the torch backend: 5 tp=2 bf16 GEMMs x 2 roles, the multi-rank row
#           against its shard on one GPU plus the NCCL collective timed alone (TP2_ARGS: more arguments)
#   vllm    the vllm kit installed, the vllm multi-rank gpu tests (tests/backends/vllm/test_ranks.py's W=1,
#           tests/run/test_ranks_gpu2.py's vllm case over two GPUs)
#   vlists  the same three lists through --backend vllm, audited
#   vcheck  bench/tp2_check.py --backend vllm
# The sequence (each call right after the last: a machine left idle 30 s is given back, bare):
#   run kind=nvidia-h200-x2 carry=[".device-kit/base-1"]  "OPERATORX_GIT_SHA=<sha> bash bench/h200_x2.sh torch"
#   run (no carry)                                         "OPERATORX_GIT_SHA=<sha> bash bench/h200_x2.sh check"
#   run carry=[".device-kit/vllm-1"] ... [".device-kit/vllm-7"], one a call     "bash bench/h200_x2.sh carry"
#   run (no carry)                                         "OPERATORX_GIT_SHA=<sha> bash bench/h200_x2.sh vllm"
#   run (no carry)                                         "OPERATORX_GIT_SHA=<sha> bash bench/h200_x2.sh vlists"
#   run (no carry)                                         "OPERATORX_GIT_SHA=<sha> bash bench/h200_x2.sh vcheck"
# A call that reports warm: false got a bare machine: a mode then says which kit to carry again.
# Everything it writes is under $OUT: install.txt, host.txt, tests*.txt, lists/, res_<backend>_<list>/ (the
# result documents), lists_<backend>.db, list_<backend>_<list>.txt, audit_<backend>.txt, tp2_check_*.{json,txt}.
set -uo pipefail
export PYTHONUNBUFFERED=1
LISTS="gemm_parallel moe_parallel smoke_parallel"
need_kit() {   # kit: installed on this machine, or its chunks here to install
  [ -f "/tmp/site/.operatorx-$1" ] || [ -d ".device-kit/$1-1" ] && return 0
  echo "the $1 kit is not on this machine (a fresh one?): carry .device-kit/$1-1 (all its chunks) again"; exit 3
}
host_facts() {
  echo "== host"
  { nvidia-smi --query-gpu=index,name,driver_version,pci.bus_id,clocks.max.sm,power.limit --format=csv
    nvidia-smi topo -m
    nvidia-smi nvlink --status -i 0 | head -8
    python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', \
torch.cuda.nccl.version(), 'gpus', torch.cuda.device_count())"
  } > "$OUT/host.txt" 2>&1
  head -4 "$OUT/host.txt"; tail -1 "$OUT/host.txt"
}
list_runs() {   # backend, seconds per list
  python3 bench/parallel_lists.py write --max-world 2 --out "$OUT/lists" $LISTS
  for l in $LISTS; do
    echo "== $l (tp·dp <= 2) through $1 on GPUs 0,1"
    timeout "$2" python3 -m operatorx run -t "$OUT/lists/${l}_w2.json" --backend "$1" --gpus 0,1 \
      --db "$OUT/lists_$1.db" --results-dir "$OUT/res_$1_$l" > "$OUT/list_$1_$l.txt" 2>&1; echo "rc $?"
    grep -v "Warning\|INFO\|warn" "$OUT/list_$1_$l.txt" | tail -4
  done
  echo "== audit ($1)"
  python3 bench/parallel_lists.py audit --device cuda $(for l in $LISTS; do echo "$OUT/res_$1_$l"; done) \
    > "$OUT/audit_$1.txt" 2>&1; echo "rc $?"
  cut -c1-400 "$OUT/audit_$1.txt" | tail -60
}
tp2_check() {   # backend, seconds
  echo "== tp2_check through $1"
  timeout "$2" python3 bench/tp2_check.py --device cuda --backend "$1" --work "/tmp/tp2_check_$1" \
    --out "$OUT/tp2_check_$1.json" ${TP2_ARGS:-} > "$OUT/tp2_check_$1.txt" 2>&1; echo "rc $?"
  grep -v "Warning\|INFO\|warn" "$OUT/tp2_check_$1.txt" | tail -40
}
case "${1:-carry}" in
  carry)
    ls .device-kit ;;
  torch)
    need_kit base
    . bench/device_kit.sh
    tail -2 "$OUT/install.txt"
    host_facts
    if [ -n "${FULL:-}" ]; then
      gpu_tests
    else
      echo "== gpu tests of the multi-rank path"
      timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider -k "not vllm" tests/run/test_ranks_gpu.py \
        tests/run/test_ranks_gpu2.py tests/backends/torch/test_collective_gpu.py > "$OUT/tests.txt" 2>&1
      grep -E "passed|failed|FAILED|ERROR|skipped" "$OUT/tests.txt" | tail -15
    fi
    list_runs torch 110 ;;
  check)
    need_kit base
    . bench/device_kit.sh
    tp2_check torch 540 ;;
  vllm)
    need_kit base; need_kit vllm
    . bench/device_kit.sh
    tail -2 "$OUT/install.txt"
    echo "== vllm multi-rank gpu tests"
    timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider tests/backends/vllm/test_ranks.py \
      "tests/run/test_ranks_gpu2.py::test_tp2_gemm_and_ep2_moe_rows_carry_skew_and_each_ranks_telemetry[vllm]" \
      > "$OUT/tests_vllm.txt" 2>&1
    grep -E "passed|failed|FAILED|ERROR|skipped" "$OUT/tests_vllm.txt" | tail -15 ;;
  vlists)
    need_kit base; need_kit vllm
    . bench/device_kit.sh
    list_runs vllm 170 ;;
  vcheck)
    need_kit base; need_kit vllm
    . bench/device_kit.sh
    tp2_check vllm 540 ;;
esac
