#!/usr/bin/env bash
# PowerSGD's bucket size on the 8-host fleet stand-in at batch 8, in one short device call: one bucket (the
# chain runs once, after the backward pass), 100 MB, and the strategy's 5 MB, each launch with its own compute
# series. After benchmarks/gpu_host/prepare.sh here, with ".devtools" carried:
#   BUDGET=230 bash benchmarks/gpu_host/powersgd.sh
# Results under $OUT (results.tgz, log.txt); the launches run in that order, each within what is left.
BUDGET=${BUDGET:-300}; . benchmarks/gpu_host/common.sh
F="python3 benchmarks/fleet_ddp.py --device cuda --rate 10gbit --steps 6 --warmup 2 --hosts 8 --batch 8"
for b in 1000 100 5; do
  [ $(L 60) -lt 45 ] && break
  timeout $(L 90) $F --series compute,mccl+powersgd:bucket=$b:label=powersgd-b$b --timeout $(($(L 90) - 3)) \
    --out "$R/psgd8_b$b"
done
tar czf "$OUT/results.tgz" -C "$R" .
