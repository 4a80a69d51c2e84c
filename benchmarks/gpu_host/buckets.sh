#!/usr/bin/env bash
# DDP bucket size on the 8-host fleet stand-in (docs/performance.md, "DDP settings for fleets"), mccl and
# Gloo each at DDP's default 25 MB and at 5 and 2 MB, batch 8 and 32, in one device call of about
# 8 minutes (after benchmarks/gpu_host/prepare.sh here, with ".devtools" carried):
#   bash benchmarks/gpu_host/buckets.sh          (SERIES=... for other series)
BUDGET=570; . benchmarks/gpu_host/common.sh
F="python3 benchmarks/fleet_ddp.py --device cuda --rate 10gbit --steps 10 --warmup 2 --hosts 8"
S=${SERIES:-compute,mccl,gloo,mccl:bucket=5:label=mccl-bucket5,gloo:bucket=5:label=gloo-bucket5,mccl:bucket=2:label=mccl-bucket2}
timeout $(L 280) $F --batch 32 --timeout 270 --out "$R/ddp32_buckets" --series $S
timeout $(L 250) $F --batch 8 --timeout 240 --out "$R/ddp8_buckets" --series $S
tar czf "$OUT/results.tgz" -C "$R" .
