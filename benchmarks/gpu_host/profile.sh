#!/usr/bin/env bash
# Where the CPU goes in the 8-host fleet stand-in (docs/performance.md, "Where the CPU goes"):
# each launch runs one DDP series next to its compute-only series under thread_cpu.py, which samples every
# thread of the ranks and the machine's busy cores. One device call of under 10 minutes, after
# benchmarks/gpu_host/prepare.sh here, with ".devtools" carried. Results under $OUT (results.tgz, log.txt).
BUDGET=570; . benchmarks/gpu_host/common.sh
S="python3 benchmarks/gpu_host/thread_cpu.py --match fleet_ddp.py --interval 0.5"
F="python3 benchmarks/fleet_ddp.py --device cuda --rate 10gbit --steps 10 --warmup 2 --hosts 8 --timeout 110"
run() {  # name batch series [VAR=value ...]
  local name=$1 batch=$2 series=$3; shift 3
  env "$@" timeout $(L 120) $S --out "$R/$name.cpu.csv" -- $F --batch $batch --series $series --out "$R/$name"
}
run mccl32 32 compute,mccl
run gloo32 32 compute,gloo
run mccl8 8 compute,mccl
run mccl8_nosender 8 compute,mccl MCCL_SEND_THREAD_BYTES=0
run bf16w8 8 compute,mccl-bf16
tar czf "$OUT/results.tgz" -C "$R" .
