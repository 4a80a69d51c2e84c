#!/usr/bin/env bash
# The ring allreduce without the seam between its halves (docs/performance.md, "What holds the compressed ring
# back"), in one device call of about 7 minutes, after benchmarks/gpu_host/prepare.sh here, with ".devtools"
# carried:   bash benchmarks/gpu_host/seam.sh
# 1. float32 and bf16 on the wire, 16-256 MiB, on 8 and on 4 hosts;
# 2. the fleet stand-in at batch 8, 5 MB buckets: mccl, the engine's bf16 wire, torch's bf16 hook, and Gloo.
BUDGET=${BUDGET:-560}; . benchmarks/gpu_host/common.sh
A="python3 benchmarks/allreduce.py --rate 10gbit --sizes 16M,64M,256M --baseline mccl --iters 6 --min-iters 6
   --time-budget 3 --timeout 120 --series mccl,mccl:MCCL_WIRE_DTYPE=bf16:label=mccl-bf16:rtol=3e-2"
timeout $(L 130) $A --hosts 8 --out "$R/ar8"
timeout $(L 110) $A --hosts 4 --out "$R/ar4"
timeout $(L 280) python3 benchmarks/fleet_ddp.py --device cuda --rate 10gbit --steps ${STEPS:-10} --warmup 2 --hosts 8 \
  --batch 8 --timeout 270 --out "$R/ddp8" --series \
  compute,mccl:bucket=5,mccl-bf16:bucket=5,mccl+bf16_hook:bucket=5,gloo
tar czf "$OUT/results.tgz" -C "$R" . && rm -rf "$R"
