#!/usr/bin/env bash
# Which phase of the compressed ring falls behind the link, and whether the engine's own CPU use slows the
# emulated links (docs/performance.md, "Where the CPU goes in the compressed ring"). One device call of about
# 3 minutes (after benchmarks/gpu_host/prepare.sh here, with ".devtools" carried):
#   bash benchmarks/gpu_host/wire_phases.sh
# 8 hosts, 64 and 256 MiB: allreduce and its first half alone (reduce_scatter), float32 and bf16 on the wire,
# and bf16 with the conversions on the progress thread alone (MCCL_REDUCE_THREADS=1) or no spinning (MCCL_SPIN_US=0).
BUDGET=${BUDGET:-300}; . benchmarks/gpu_host/common.sh
W=MCCL_WIRE_DTYPE=bf16
timeout $(L 280) python3 benchmarks/allreduce.py --rate 10gbit --hosts 8 --op allreduce,reduce_scatter --sizes 64M,256M \
  --iters 6 --min-iters 6 --time-budget 4 --timeout 120 --baseline mccl --out "$R/ar8_phases" --series \
mccl,mccl:$W:label=bf16:rtol=3e-2,mccl:$W:MCCL_REDUCE_THREADS=1:label=bf16-1thread:rtol=3e-2,\
mccl:$W:MCCL_SPIN_US=0:label=bf16-nospin:rtol=3e-2
tar czf "$OUT/results.tgz" -C "$R" . && rm -rf "$R"
