# Sourced by the bench/h200_*.sh device scripts: install each carried kit (../shared/device/README.md)
# into /tmp/site once per machine, and put it and the project's src on PYTHONPATH.
for kit in base vllm ct; do
  if [ -d ".device-kit/$kit-1" ] && [ ! -f "/tmp/site/.operatorx-$kit" ]; then
    bash ".device-kit/$kit-1/install.sh" >> "$OUT/install.txt" 2>&1 && touch "/tmp/site/.operatorx-$kit"
  fi
done
export PYTHONPATH=/tmp/site:$PWD/src
