#!/usr/bin/env bash
# The stand-in with its hosts on cubic (mccl switch's default since the slow mode was traced to the GPU host's
# BBR: docs/performance.md, "The slow mode"), in one device call of about 8 minutes, after
# benchmarks/gpu_host/prepare.sh here, with ".devtools" carried:   bash benchmarks/gpu_host/congestion.sh
# 1. batch 8: mccl (5 MB buckets and DDP's 25 MB), torch's bf16 hook over mccl, Gloo, 12 timed steps;
# 2. allreduce, float32 and bf16 on the wire, 16-256 MiB, 8 and 4 hosts;
# 3. batch 32: mccl (5 MB buckets), Gloo; 4. PowerSGD at rank 4, batch 8, one bucket, batched.
# CONGESTION=system runs it all on the machine's own default instead.
BUDGET=${BUDGET:-560}; . benchmarks/gpu_host/common.sh
C="--congestion ${CONGESTION:-cubic}"
F="python3 benchmarks/fleet_ddp.py --device cuda --rate 10gbit $C --warmup 2 --hosts 8"
timeout $(L 190) $F --steps 12 --batch 8 --timeout 185 --out "$R/ddp8" \
  --series compute,mccl:bucket=5,mccl+bf16_hook:bucket=5,gloo,mccl
A="python3 benchmarks/allreduce.py --rate 10gbit $C --sizes 16M,64M,256M --baseline mccl --iters 6 --min-iters 6
   --time-budget 3 --timeout 120 --series mccl,mccl:MCCL_WIRE_DTYPE=bf16:label=mccl-bf16:rtol=3e-2"
timeout $(L 80) $A --hosts 8 --out "$R/ar8"
timeout $(L 70) $A --hosts 4 --out "$R/ar4"
timeout $(L 130) $F --steps 8 --batch 32 --timeout 125 --out "$R/ddp32" --series compute,mccl:bucket=5,gloo
timeout $(L 90) $F --steps 8 --batch 8 --powersgd-rank 4 --timeout 85 --out "$R/psgd8_r4" \
  --series compute,mccl+powersgd_batched:bucket=1000:label=powersgd_batched-r4-b1000
tar czf "$OUT/results.tgz" -C "$R" . && rm -rf "$R"
