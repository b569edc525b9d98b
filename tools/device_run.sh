#!/usr/bin/env bash
# Idempotent set-up on the H200 device machine (../shared/DEVICE.md), then run "$@".
#   * copies carried model halves (.devcarry/m1, .devcarry/m2) to /root/ninfer-model and
#     joins them into SmolLM2-135M-Instruct.Q4_1.gguf once both are there (sha256 printed);
#   * installs the carried wheels (.whl) into /tmp/site unless already done on this machine;
#   * exports PYTHONPATH=/tmp/site:$PWD, PYTHONUNBUFFERED=1, NINFER_GGUF=<model path>.
# usage (from the repo root, inside a `run`): bash tools/device_run.sh CMD [ARGS...]
set -uo pipefail
M=/root/ninfer-model
G=$M/SmolLM2-135M-Instruct.Q4_1.gguf
mkdir -p "$M"
for d in .devcarry/m1 .devcarry/m2; do
  [ -d "$d" ] && cp -n "$d"/* "$M"/ 2>/dev/null
done
if [ ! -s "$G" ] && [ -s "$M/model.part00" ] && [ -s "$M/model.part01" ]; then
  cat "$M"/model.part0* > "$G.tmp" && mv "$G.tmp" "$G" && sha256sum "$G"
fi
if [ ! -f /tmp/site/.ninfer-wheels-ok ]; then
  if [ ! -d .whl ]; then echo "device_run: /tmp/site is empty and .whl was not carried" >&2; exit 2; fi
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && touch /tmp/site/.ninfer-wheels-ok || exit 3
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NINFER_GGUF=$G
"$@"
