#!/usr/bin/env bash
# Is a process's launch-gap level where its host memory lies? (issue 15, benchmarks §22)
# The GPU fetches each queued launch from a command buffer in host memory; a buffer on the far NUMA node
# would add a fetch latency at every kernel boundary, fixed for the process's life. Prints the topology,
# then runs bench/gap_events_probe.py pinned to each NUMA node's CPUs in turn (REPS processes each).
set -uo pipefail
. bench/device_kit.sh
lscpu | grep -iE "model name|numa|socket|^cpu\(s\)"
nvidia-smi topo -m 2>/dev/null | head -6
for d in /sys/bus/pci/devices/*; do
  [ "$(cat $d/vendor 2>/dev/null)" = "0x10de" ] && [ "$(cat $d/class)" = "0x030200" ] && echo "gpu $(basename $d) numa_node $(cat $d/numa_node) local_cpulist $(cat $d/local_cpulist)"
done
python3 -c "import pynvml as n; n.nvmlInit(); h=n.nvmlDeviceGetHandleByIndex(0); print('nvml cpu affinity mask', [hex(x) for x in n.nvmlDeviceGetCpuAffinity(h, 4)])" 2>&1 | tail -1
which numactl taskset
nodes=$(ls -d /sys/devices/system/node/node* 2>/dev/null | xargs -n1 basename)
echo "nodes: $nodes"
MODE=${MODE:-after}
for r in $(seq "${REPS:-3}"); do
  for n in $nodes; do
    cpus=$(cat /sys/devices/system/node/$n/cpulist)
    if which numactl > /dev/null; then pin="numactl --cpunodebind=${n#node} --membind=${n#node}"; else pin="taskset -c $cpus"; fi
    echo -n "$n ($cpus) "; timeout 60 $pin python3 bench/gap_events_probe.py --mode $MODE 2>&1 | grep mode
  done
  for c in ${CORES:-}; do
    echo -n "core $c "; timeout 60 taskset -c $c python3 bench/gap_events_probe.py --mode $MODE 2>&1 | grep mode
  done
done
