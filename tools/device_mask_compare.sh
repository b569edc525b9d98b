#!/usr/bin/env bash
# usage on the device (../shared/DEVICE.md): the dev data file travels as a carried, git-ignored copy
# (.devcarry/data, not part of the project); the model and wheels as tools/device_run.sh expects.
# mask_compare over the dev set, 15 shards side by side on the device host's CPU cores (no GPU used)
set -u
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
G=/root/ninfer-model/SmolLM2-135M-Instruct.Q4_1.gguf
D=.devcarry/data/jsonschemabench-maskbench-dev.jsonl.gz
N=15; LIM=${LIM:-45}; CAP=${CAP:-500}
mkdir -p /root/mc
nproc; uptime
for k in $(seq 0 $((N-1))); do
  timeout -s INT $CAP python3 bench/mask_compare.py $D --model $G --limit $LIM --repeats 5 --compile-timeout 20 \
    --shard $k/$N --checkpoint 2 --no-plot --out /root/mc/s$k \
    --note "H200 host CPU (16 cores), 15 shards side by side, one core each" > /root/mc/s$k.log 2>&1 &
done
wait
ls /root/mc/*.json | wc -l
python3 bench/mask_compare.py $D --merge /root/mc/s*.json --out $OUT/mask_compare_dev_h200host 2>&1 | tail -40
cp /root/mc/s0.log $OUT/ 2>/dev/null
