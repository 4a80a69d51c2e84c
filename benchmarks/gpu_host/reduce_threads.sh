#!/usr/bin/env bash
# bf16 on the wire with its conversions split over MCCL_REDUCE_THREADS (auto: 4 on a stand-in host, which has
# the machine's 16 CPUs for one rank) against the progress thread alone (1), in one device call of about
# 8 minutes (after benchmarks/gpu_host/prepare.sh here, with ".devtools" carried):
#   bash benchmarks/gpu_host/reduce_threads.sh
# 1. allreduce on 8 and 4 hosts at 10 Gbit/s, 16-256 MiB: float32, bf16, bf16 with one reduce thread;
# 2. the 8-host fleet stand-in at batch 8 with 5 MB buckets: the engine's bf16 against torch's bf16 hook.
BUDGET=570; . benchmarks/gpu_host/common.sh
A="python3 benchmarks/allreduce.py --rate 10gbit --iters 6 --min-iters 3 --time-budget 2 --timeout 150
   --sizes 16M,64M,256M --baseline mccl --series mccl,mccl:MCCL_WIRE_DTYPE=bf16:label=bf16:rtol=3e-2,\
mccl:MCCL_WIRE_DTYPE=bf16:MCCL_REDUCE_THREADS=1:label=bf16-1thread:rtol=3e-2,\
mccl:MCCL_WIRE_DTYPE=bf16:MCCL_REDUCE_THREADS=2:label=bf16-2threads:rtol=3e-2"
timeout $(L 170) $A --hosts 8 --out "$R/ar8_bf16_threads"
timeout $(L 140) $A --hosts 4 --out "$R/ar4_bf16_threads"
F="python3 benchmarks/fleet_ddp.py --device cuda --rate 10gbit --steps 8 --warmup 2 --hosts 8"
timeout $(L 230) $F --batch 8 --timeout 220 --out "$R/ddp8_bf16" --series \
  compute,gloo,mccl:bucket=5:label=mccl-b5,mccl-bf16:bucket=5:label=wire-bf16-b5,mccl+bf16_hook:bucket=5:label=hook-bf16-b5
tar czf "$OUT/results.tgz" -C "$R" .
