#!/usr/bin/env bash
# Pack the vLLM engine kit (bench/engine-kit.txt) into .device-kit/engine-1..N.
# llguidance 1.7.x exists only as a manylinux_2_31 wheel (the H200 image has glibc 2.39), a platform
# that pack-wheels.sh does not list, so it is put into the kit's wheel folder first; pack-wheels.sh
# packs every wheel in that folder.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
mkdir -p .device-kit/.wheels-engine
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_31_x86_64 -d .device-kit/.wheels-engine llguidance==1.7.6
../shared/device/pack-wheels.sh engine bench/engine-kit.txt
