# Sourced by the bench/h200_*.sh device scripts: install each carried kit (../shared/device/README.md;
# `all` is the vllm, engine and base wheels in one kit of 51-MiB chunks, the fewest calls;
# `pyd` is pydantic alone, for a call that carries no vllm kit)
# into /tmp/site once per machine, and put it and the project's src on PYTHONPATH.
for kit in all base pyd vllm engine ct; do
  if [ -d ".device-kit/$kit-1" ] && [ ! -f "/tmp/site/.operatorx-$kit" ]; then
    bash ".device-kit/$kit-1/install.sh" >> "$OUT/install.txt" 2>&1 && touch "/tmp/site/.operatorx-$kit"
  fi
done
# The base kit's typing_extensions (4.15) shadows the image's newer one, which the image's anyio needs
# (`from typing_extensions import sentinel`, on the engine's fastapi import): keep the image's.
if [ -f /tmp/site/typing_extensions.py ] && python3 -c "from typing_extensions import sentinel" 2>/dev/null; then
  mv /tmp/site/typing_extensions.py /tmp/site/typing_extensions.py.kit
fi
export PYTHONPATH=/tmp/site:$PWD/src
# cutlass DSL puts its packages on sys.path through a .pth file, which a PYTHONPATH folder does not read
# (flashinfer's SM90 GDN prefill needs them): the path that file adds
if [ -d /tmp/site/nvidia_cutlass_dsl/dsl_packages ]; then
  export PYTHONPATH=$PYTHONPATH:/tmp/site/nvidia_cutlass_dsl/dsl_packages
fi

# The gpu tests of the code that runs on the GPU (measure, run, platform, the torch backends, the row
# model), their log in $OUT/tests.txt and the summary lines printed: the first step of a final call.
gpu_tests() {
  echo "== gpu tests"
  timeout 240 python3 -m pytest -m gpu -q -p no:cacheprovider tests/measure tests/run tests/platform \
    tests/backends/torch tests/test_result.py > "$OUT/tests.txt" 2>&1
  grep -E "passed|failed|FAILED|ERROR" "$OUT/tests.txt" | tail -15
}

# A pytest log's verdict lines.
summary() {
  grep -E "passed|failed|FAILED|XPASS|XFAIL|^E " "$1" | tail -30
}
