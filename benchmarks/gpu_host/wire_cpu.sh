#!/usr/bin/env bash
# Which thread caps bf16 on the wire, and smaller DDP buckets at batch 32 (docs/performance.md), in one
# device call of about 7 minutes (after benchmarks/gpu_host/prepare.sh here, with ".devtools" carried):
#   bash benchmarks/gpu_host/wire_cpu.sh
# 1. thread_cpu.py samples the threads of 8 ranks on the emulated 10 Gbit/s switch while they run 256 MiB
#    allreduces, float32 and bf16 on the wire (one launch each);
# 2. the fleet stand-in at batch 32 with 5 and 10 MB buckets against the defaults and Gloo.
BUDGET=560; . benchmarks/gpu_host/common.sh
S="python3 benchmarks/gpu_host/thread_cpu.py --match allreduce.py --interval 0.5"
A="python3 benchmarks/allreduce.py --rate 10gbit --hosts 8 --sizes 256M --iters 8 --min-iters 8 --time-budget 4 --timeout 100"
timeout $(L 80) $S --out "$R/ar8_fp32.cpu.csv" -- $A --series mccl --out "$R/ar8_fp32"
timeout $(L 80) $S --out "$R/ar8_bf16.cpu.csv" -- $A --series mccl:MCCL_WIRE_DTYPE=bf16:label=bf16:rtol=3e-2 --out "$R/ar8_bf16"
F="python3 benchmarks/fleet_ddp.py --device cuda --rate 10gbit --steps 6 --warmup 2 --hosts 8"
timeout $(L 250) $F --batch 32 --timeout 240 --out "$R/ddp32_buckets" \
  --series compute,mccl,gloo,mccl:bucket=5:label=bucket5,mccl:bucket=10:label=bucket10
tar czf "$OUT/results.tgz" -C "$R" .
