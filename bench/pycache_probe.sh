#!/usr/bin/env bash
# How long a fresh interpreter takes to import what a sweep worker imports (torch, SciPy's stats,
# pydantic, the project's timing path), with the image's environment as found and with a bytecode
# cache under a prefix directory (PYTHONPYCACHEPREFIX, PYTHONDONTWRITEBYTECODE unset). The first
# cached run writes the cache; the later ones read it. No GPU work.
#   bash bench/pycache_probe.sh [repeats]
set -uo pipefail
REPEATS=${1:-3}
env | grep -E "^PYTHON" | sort
PROBE='import time; t=time.perf_counter(); import torch, scipy.stats, pydantic; import operatorx.measure.kernel_timing, operatorx.run.job; print(f"import_s {time.perf_counter()-t:.3f}")'
export PYTHONPATH=/tmp/site:$PWD/src
for i in $(seq "$REPEATS"); do echo -n "as found: "; python3 -c "$PROBE"; done
CACHE=$(mktemp -d)
for i in $(seq "$REPEATS"); do
  echo -n "prefix cache run $i: "; env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX="$CACHE" python3 -c "$PROBE"
done
du -sh "$CACHE"; rm -rf "$CACHE"
