#!/usr/bin/env bash
# PowerSGD on the 8-host fleet stand-in, in one short device call: each RUNS item HOOK:BUCKET_MB:BATCH[:RANK]
# (RANK: PowerSGD's matrix rank, fleet_ddp's --powersgd-rank default when not given) is a launch of its own (with its compute series), in that order, each within what is left of BUDGET. By default
# PowerSGD's bucket size at batch 8: one bucket (the chain runs once, after the backward pass), 100 MB, and
# 5 MB. After benchmarks/gpu_host/prepare.sh here, with ".devtools" carried:
#   BUDGET=222 bash benchmarks/gpu_host/powersgd.sh
#   RUNS="powersgd:1000:8 powersgd_batched:1000:8 powersgd:1000:8:1 powersgd_batched:1000:32" bash ...
# Results under $OUT (results.tgz: one folder per launch, log.txt).
BUDGET=${BUDGET:-300}; . benchmarks/gpu_host/common.sh
F="python3 benchmarks/fleet_ddp.py --device cuda --rate 10gbit --steps 6 --warmup 2 --hosts 8"
for run in ${RUNS:-powersgd:1000:8 powersgd:100:8 powersgd:5:8}; do
  IFS=: read -r hook mb batch rank <<< "$run"
  [ $(L 60) -lt 45 ] && break
  timeout $(L 90) $F --batch $batch ${rank:+--powersgd-rank $rank} \
    --series compute,mccl+$hook:bucket=$mb:label=$hook${rank:+-r$rank}-b$mb \
    --timeout $(($(L 90) - 3)) --out "$R/psgd${batch}_b$mb${hook#powersgd}${rank:+_r$rank}"
done
tar czf "$OUT/results.tgz" -C "$R" .
