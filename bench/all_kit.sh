#!/usr/bin/env bash
# Pack the vllm, engine and base kits' wheels (../shared/device/README.md, bench/engine_kit.sh, built first)
# into one kit, .device-kit/all-1..9, in 51-MiB chunks: with the ~12 MiB project tree each call stays under
# the device tool's 64 MiB, and 9 back-to-back calls carry what 12 carried (a lost machine costs them all).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
mkdir -p .device-kit/.wheels-all
for kit in vllm engine base; do
  cp -n -l ".device-kit/.wheels-$kit"/*.whl .device-kit/.wheels-all/
done
CHUNK_MIB=51 ../shared/device/pack-wheels.sh all annotated-types==0.7.0
