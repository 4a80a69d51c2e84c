#!/usr/bin/env bash
# Where the training step goes on the 8-host fleet stand-in (docs/performance.md, "Where the step goes"):
# batch 8 and 32, mccl with the strategy's 5 MB buckets and with DDP's 25 MB, Gloo, and at batch 8 torch's
# bf16 hook with 5 MB buckets (what compress="bf16" runs on an accelerator); the engine's timeline splits each
# mccl step (benchmarks/sweep/ddp_timeline.py). Then PowerSGD with MCCLStrategy(compress="powersgd")'s settings
# (rank 1, same-shaped matrices batched, one bucket; from step 2, where the strategy starts at 10) at batch 32. One device call of about 5 minutes, after
# benchmarks/gpu_host/prepare.sh here, with ".devtools" carried:
#   bash benchmarks/gpu_host/timeline.sh     (SERIES=... for other series at both batches; STEPS=N timed steps; SKIP_POWERSGD=1)
BUDGET=${BUDGET:-420}; . benchmarks/gpu_host/common.sh
F="python3 benchmarks/fleet_ddp.py --device cuda --rate 10gbit --steps ${STEPS:-10} --warmup 2 --hosts 8"
S=${SERIES:-compute,mccl:bucket=5:label=mccl-bucket5,gloo,mccl}
T(){ local t=$(L $1); echo $((t > 10 ? t - 5 : t)); }  # a launch's own limit, inside the step's
timeout $(L 130) $F --batch 8 --timeout $(T 130) --out "$R/ddp8_timeline" \
  --series $S,mccl+bf16_hook:bucket=5:label=bf16_hook-bucket5
timeout $(L 150) $F --batch 32 --timeout $(T 150) --out "$R/ddp32_timeline" --series $S
[ -n "${SKIP_POWERSGD:-}" ] || timeout $(L 80) $F --batch 32 --steps 6 --powersgd-rank 1 --timeout $(T 80) \
  --out "$R/psgd32_b1000_batched_r1" --series compute,mccl+powersgd_batched:bucket=1000:label=powersgd_batched-r1-b1000
tar czf "$OUT/results.tgz" -C "$R" .
