#!/usr/bin/env bash
# Why some runs of the 8-host stand-in at batch 8 are slow (docs/performance.md, "Where the step goes"), and
# which thread caps bf16 on the wire, in one device call of about 4.5 minutes (after
# benchmarks/gpu_host/prepare.sh here, with ".devtools" carried):
#   bash benchmarks/gpu_host/slow_mode.sh      (RUNS=N launches at batch 8, STEPS=N timed steps each)
# 1. RUNS launches of fleet_ddp.py at batch 8 (5 MB and 25 MB buckets, Gloo), each under thread_cpu.py: per
#    step the engine's timeline and every host's TCP losses (timeline_steps.csv), per thread group its cores;
# 2. 8 ranks' threads while they run 64 and 256 MiB allreduces with bf16 on the wire, and float32.
BUDGET=${BUDGET:-580}; . benchmarks/gpu_host/common.sh
S="python3 benchmarks/gpu_host/thread_cpu.py --interval 0.5"
F="python3 benchmarks/fleet_ddp.py --device cuda --rate 10gbit --steps ${STEPS:-12} --warmup 2 --hosts 8 --batch 8"
for i in $(seq 1 ${RUNS:-2}); do
  timeout $(L 150) $S --match fleet_ddp --out "$R/ddp8_run$i.cpu.csv" -- $F --timeout 140 --out "$R/ddp8_run$i" \
    --series compute,mccl:bucket=5:label=mccl-bucket5,gloo,mccl
done
A="python3 benchmarks/allreduce.py --rate 10gbit --hosts 8 --sizes 64M,256M --iters 6 --min-iters 6 --time-budget 4 --timeout 100"
timeout $(L 90) $S --match allreduce.py --out "$R/ar8_bf16.cpu.csv" -- $A --out "$R/ar8_bf16" \
  --series mccl:MCCL_WIRE_DTYPE=bf16:label=bf16:rtol=3e-2
timeout $(L 90) $S --match allreduce.py --out "$R/ar8_fp32.cpu.csv" -- $A --out "$R/ar8_fp32" --series mccl
tar czf "$OUT/results.tgz" -C "$R" . && rm -rf "$R"
