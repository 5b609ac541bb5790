#!/usr/bin/env bash
# Device calls for the next H200 session (benchmarks §31), each inside one call's 600 s (OPERATORX_GIT_SHA set):
#   carry   nothing but the chunk that came with the call (all-1..9, or vllm-1..7, engine-1..4, base-1, back to back)
#   first   dsv4's probe and gpu tests (250 s), then the gpu tests not re-run at session 22's end: one call
#   dsv4    bench/dsv4_probe.py, then the dsv4_attn gpu tests (stop at the first failure)
#   v32     DeepSeek-V3.2's block-FP8 mla_dsa cases of attn_small alone, with a long case timeout (a hang's row
#           now names where its worker waited), then the mla_dsa, gdn/kda and torch attention gpu tests
#   lists   `lists SECONDS LIST...`: each list through vllm (--rank-local), SECONDS each; default attn_small, 500 s;
#           FILTER=... keeps the cases --filter keeps
#   rest    the mla gpu tests, V3.2's block-FP8 mla_dsa cases alone, upstream attn_parallel and smoke_parallel
#   resume  `resume SECONDS`: finish the run `lists` left (its database is kept on the machine)
#   mla     the vllm mla gpu tests (the fp8 latent cache among them)
#   dsv4rows `dsv4rows SECONDS`: attn_small's dsv4_attn cases, then the dsv4 gpu tests in what is left
#   verify  `verify SECONDS`: the other vllm attention gpu tests (gqa, mla, mla_dsa, gdn/kda)
#   go      `go SECONDS`: the mla and mla_dsa gpu tests, upstream attn_parallel and smoke_parallel, then attn_small, all
#           within SECONDS (default 570; `resume` finishes attn_small): session 25's one call after the carries
#   finish  `finish SECONDS`: after `lists`: finish attn_small's run, then the dsv4, mla_dsa, gqa, gdn/kda gpu
#           tests, vllm's MoE workspace tests and the mla gpu tests, each in what is left of SECONDS (session 26)
#   both    `both SECONDS`: `finish`'s gpu tests (warming the JIT caches), then attn_small, in one call; a later
#           `finish` resumes attn_small and runs the tests that did not pass or had no time (session 27)
#   stacks  `stacks [TIMEOUT_S]`: attn_small's first case with a TIMEOUT_S (default 20) case timeout, which a cold
#           machine's JIT compile (or a warm one's setup, at 5 s) outlasts: does the timeout row carry the worker's
#           Python stacks (§33 had none)? The worker's signal masks every 2 s (/proc/PID/task/*/status) say whether
#           SIGUSR1 is caught, and by which threads it is blocked; `finish` runs it at 1 s in what is left (at 5 s a warm
#           machine prepared the case in time, §35)
#   cold    `cold SECONDS [TESTS_S]`: attn_small first on the fresh machine, default case timeout and --compile-grace (do the
#           cold JIT compiles extend the deadline instead of timing out, §33?), then `finish`'s gpu tests in what
#           is left; a later `finish` resumes attn_small and runs the tests that did not pass or had no time
#   origin  `origin SECONDS [CASES]`: bench/memory_origin.py on attn_small's CASES (default 7,18: the two ratio-4
#           dsv4_attn decodes, c4 first in the process): which vLLM allocation is the 256 MiB the first c4 case keeps,
#           and does that first case read `memory.first_use` (§34's prediction)?
set -uo pipefail
export PYTHONUNBUFFERED=1
# The dsv4_attn probe and gpu tests (stop at the first failure), within `$1` seconds.
dsv4_tests() {
  timeout 60 python3 bench/dsv4_probe.py > "$OUT/dsv4_probe.txt" 2>&1; tail -15 "$OUT/dsv4_probe.txt" | cut -c1-300
  timeout "$1" python3 -m pytest -m gpu -q -p no:cacheprovider --tb=long -x \
    tests/backends/vllm/test_attention_dsv4_gpu.py > "$OUT/tests_dsv4.txt" 2>&1
  summary "$OUT/tests_dsv4.txt" | cut -c1-400
}
# The mla_dsa, gdn/kda and torch attention gpu tests, within `$1` seconds.
left_tests() {
  timeout "$1" python3 -m pytest -m gpu -q -p no:cacheprovider --tb=short tests/backends/vllm/test_attention_dsa.py \
    tests/backends/vllm/test_attention_linear.py tests/backends/torch/test_attention_gpu.py \
    > "$OUT/tests_left.txt" 2>&1
  summary "$OUT/tests_left.txt" | cut -c1-300
}
# One list through vllm (--rank-local) within `$1` seconds, its log $OUT/run_`$3`_vllm.txt, into the machine's
# database (/tmp/opx, which `resume` finishes); the rest of the arguments go to `operatorx run`.
run_list() {
  local limit_s=$1 list=$2 name=$3; shift 3
  mkdir -p /tmp/opx
  timeout "$limit_s" python3 -m operatorx run -t "$list" --backend vllm --rank-local --db /tmp/opx/attn_vllm.db \
    --results-dir /tmp/opx/res_vllm "$@" > "$OUT/run_${name}_vllm.txt" 2>&1
  echo "$name vllm rc $?: $(tail -1 "$OUT/run_${name}_vllm.txt")"
  grep -E " error |waited at" "$OUT/run_${name}_vllm.txt" | cut -c1-300 | head -5
}
# Finish the last run `lists` (or `both`) started on this machine within `$1` seconds; the database to $OUT.
resume_run() {
  timeout "$1" python3 -m operatorx run --resume latest --backend vllm --db /tmp/opx/attn_vllm.db \
    --results-dir /tmp/opx/res_vllm > "$OUT/run_resume_vllm.txt" 2>&1
  echo "resume rc $?: $(tail -1 "$OUT/run_resume_vllm.txt")"
  grep -E " error " "$OUT/run_resume_vllm.txt" | cut -c1-300 | head -5
  cp -r /tmp/opx "$OUT/"
}
# The gpu tests of the code changed since d2ebf10 (vllm MoE's workspace, gqa, gdn/kda, mla, then dsv4 and mla_dsa,
# which passed at 1ad7e78, §34), each in what is left before second `$1`; a file that passed on this machine
# (/tmp/opx/passed) is not run again.
# The `stacks` probe (see the head of this file): its row, log and the worker's signal masks go to $OUT/stacks*.
stacks_probe() {
  mkdir -p /tmp/opx
  local timeout_s=${1:-20}
  ( for _ in $(seq 45); do sleep 2; for pid in $(pgrep -f "operatorx.run.worker"); do
      echo "== second $SECONDS, worker $pid: $(tr '\0' ' ' < /proc/$pid/cmdline | cut -c1-80)"
      grep -E "^Sig(Blk|Ign|Cgt)" /proc/$pid/status
      for t in /proc/$pid/task/*; do echo "$(basename $t) $(cat $t/comm) $(grep -E '^SigBlk' $t/status)"; done
    done >> "$OUT/stacks_masks.txt" 2>&1; pgrep -f "operatorx run -t attn_small" > /dev/null || break; done ) &
  timeout 90 python3 -m operatorx run -t attn_small --backend vllm --rank-local --limit 1 --case-timeout "$timeout_s" --compile-grace 0 \
    --db /tmp/opx/stacks.db --results-dir "$OUT/stacks_res" > "$OUT/stacks_run.txt" 2>&1
  echo "stacks rc $?: $(tail -1 "$OUT/stacks_run.txt")"
  wait
  grep -c "Thread 0x" -r "$OUT/stacks_res" | head -3
  grep -ho "waited at [^\"]*" -r "$OUT/stacks_res" | head -2
  grep -E "^Sig" "$OUT/stacks_masks.txt" | head -6
}
changed_tests() {
  local end=$1 t name k
  mkdir -p /tmp/opx/passed
  for t in tests/backends/vllm/test_gpu.py tests/backends/vllm/test_attention.py \
           tests/backends/vllm/test_attention_linear.py tests/backends/vllm/test_attention_mla.py \
           tests/backends/vllm/test_attention_dsv4_gpu.py tests/backends/vllm/test_attention_dsa.py; do
    name=$(basename "$t" .py); k=(); [ "$name" = test_gpu ] && k=(-k "memory_back or forced_routing")
    [ -e "/tmp/opx/passed/$name" ] && { echo "$name: passed earlier on this machine"; continue; }
    [ $(( end - SECONDS )) -gt 30 ] || { echo "$name: no time left"; continue; }
    timeout $(( end - SECONDS )) python3 -m pytest -m gpu -q -p no:cacheprovider --tb=short "${k[@]}" "$t" \
      > "$OUT/$name.txt" 2>&1 && touch "/tmp/opx/passed/$name"
    echo "$name: $(summary "$OUT/$name.txt" | tail -1 | cut -c1-200)"
    summary "$OUT/$name.txt" | grep -E "FAILED|^E " | cut -c1-300 | head -6
  done
}
case "${1:-carry}" in
  carry)
    ls .device-kit ;;
  first)
    . bench/device_kit.sh
    tail -1 "$OUT/install.txt"
    dsv4_tests 250
    left_tests 200 ;;
  dsv4)
    . bench/device_kit.sh
    tail -1 "$OUT/install.txt"
    dsv4_tests 420 ;;
  v32)
    . bench/device_kit.sh
    timeout 300 python3 -m operatorx run -t attn_small --backend vllm --rank-local --filter "mla_dsa H=7168" \
      --case-timeout 240 --db "$OUT/v32.db" --results-dir "$OUT/res_v32" > "$OUT/run_v32.txt" 2>&1
    echo "v32 rc $?: $(tail -1 "$OUT/run_v32.txt")"
    grep -E "error|waited at" "$OUT/run_v32.txt" | cut -c1-400 | head -6
    left_tests 280 ;;
  mla)
    . bench/device_kit.sh
    timeout 400 python3 -m pytest -m gpu -q -p no:cacheprovider --tb=short tests/backends/vllm/test_attention_mla.py \
      > "$OUT/tests_mla.txt" 2>&1
    summary "$OUT/tests_mla.txt" ;;
  lists)
    # `lists [SECONDS LIST...]`: the given lists (default: attn_small) through vllm, SECONDS each (default 500);
    # the database stays on the machine (/tmp/opx) so that `resume` can finish a list the limit cut
    . bench/device_kit.sh
    limit_s=${2:-500}
    shift 2 2>/dev/null || shift $#
    for list in "${@:-attn_small}"; do
      run_list "$limit_s" "$list" "$(basename "$list" .json)" ${FILTER:+--filter "$FILTER"}
    done
    cp -r /tmp/opx "$OUT/" ;;
  rest)
    # the vllm mla gpu tests (fp8 latent cache), DeepSeek-V3.2's block-FP8 mla_dsa cases alone (long case
    # timeout), then upstream's attn_parallel and smoke_parallel through vllm: one call
    . bench/device_kit.sh
    timeout 170 python3 -m pytest -m gpu -q -p no:cacheprovider --tb=short tests/backends/vllm/test_attention_mla.py \
      > "$OUT/tests_mla.txt" 2>&1
    summary "$OUT/tests_mla.txt" | cut -c1-300
    run_list 230 attn_small v32 --filter "mla_dsa H=7168" --case-timeout 200
    for list in tests/spec/upstream/attn_parallel.json tests/spec/upstream/smoke_parallel.json; do
      run_list 80 "$list" "$(basename "$list" .json)"
    done
    cp -r /tmp/opx "$OUT/" ;;
  go)
    . bench/device_kit.sh
    tail -1 "$OUT/install.txt"
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv
    timeout 240 python3 -m pytest -m gpu -q -p no:cacheprovider --tb=short tests/backends/vllm/test_attention_mla.py \
      tests/backends/vllm/test_attention_dsa.py > "$OUT/tests_mla.txt" 2>&1
    summary "$OUT/tests_mla.txt" | cut -c1-300
    for list in tests/spec/upstream/attn_parallel.json tests/spec/upstream/smoke_parallel.json; do
      run_list 80 "$list" "$(basename "$list" .json)"
    done
    # attn_small gets what is left of the call's `$2` seconds (default 570), 20 s kept for the copy
    run_list $(( ${2:-570} - SECONDS - 20 )) attn_small attn_small
    cp -r /tmp/opx "$OUT/" ;;
  dsv4rows)
    # `dsv4rows SECONDS`: attn_small's dsv4_attn cases through vllm (the workspace given back at release),
    # then, in what is left of SECONDS, the dsv4 gpu tests
    . bench/device_kit.sh
    tail -1 "$OUT/install.txt"
    run_list $(( ${2:-400} - SECONDS - 10 )) attn_small dsv4 --filter dsv4_attn
    cp -r /tmp/opx "$OUT/"
    left=$(( ${2:-400} - SECONDS - 5 ))
    if [ "$left" -gt 60 ]; then
      timeout "$left" python3 -m pytest -m gpu -q -p no:cacheprovider --tb=short -x \
        tests/backends/vllm/test_attention_dsv4_gpu.py > "$OUT/tests_dsv4.txt" 2>&1
      summary "$OUT/tests_dsv4.txt" | cut -c1-300
    fi ;;
  verify)
    # the vllm attention gpu tests but dsv4's (dsv4rows runs those): the code under base.py's workspace release
    . bench/device_kit.sh
    tail -1 "$OUT/install.txt"
    timeout "${2:-540}" python3 -m pytest -m gpu -q -p no:cacheprovider --tb=short tests/backends/vllm/test_attention.py \
      tests/backends/vllm/test_attention_mla.py tests/backends/vllm/test_attention_dsa.py \
      tests/backends/vllm/test_attention_linear.py > "$OUT/tests_verify.txt" 2>&1
    summary "$OUT/tests_verify.txt" | cut -c1-300 ;;
  finish)
    . bench/device_kit.sh
    end=$(( ${2:-570} - 10 ))
    resume_run $(( end - SECONDS ))
    changed_tests "$end"
    [ $(( end - SECONDS )) -gt 45 ] && stacks_probe 1 ;;
  both)
    # `both SECONDS`: the gpu tests `finish` runs first (they also fill the JIT caches: DeepGEMM's nvcc kernels,
    # Triton's, on a fresh machine; a first case that compiled them took over 84 s, §33), then attn_small with a
    # 180-s case timeout, in what is left (one call); a later `finish` runs the rest of either
    . bench/device_kit.sh
    tail -1 "$OUT/install.txt"
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv
    end=$(( ${2:-570} - 10 ))
    changed_tests $(( end - 240 ))
    run_list $(( end - SECONDS )) attn_small attn_small --case-timeout 180
    cp -r /tmp/opx "$OUT/" ;;
  cold)
    . bench/device_kit.sh
    tail -1 "$OUT/install.txt"
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv
    end=$(( ${2:-570} - 10 ))
    run_list $(( end - ${3:-200} - SECONDS )) attn_small attn_small
    grep -E "compiled kernels" "$OUT/run_attn_small_vllm.txt" | cut -c1-300 | head -5
    cp -r /tmp/opx "$OUT/"
    changed_tests "$end" ;;
  origin)
    . bench/device_kit.sh
    tail -1 "$OUT/install.txt"
    end=$(( ${2:-570} - 10 ))
    timeout $(( end - SECONDS )) python3 bench/memory_origin.py attn_small "${3:-7,18}" > "$OUT/memory_origin.txt" 2>&1
    echo "memory_origin rc $?"; grep -E "^case|kept|^      " "$OUT/memory_origin.txt" | head -40 | cut -c1-200 ;;
  stacks)
    . bench/device_kit.sh
    stacks_probe "${2:-20}" ;;
  resume)
    # `resume [SECONDS]`: finish the last run `lists` started on this machine
    . bench/device_kit.sh
    resume_run "${2:-500}" ;;
esac
