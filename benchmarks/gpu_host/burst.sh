#!/usr/bin/env bash
# Is the 16-bit ring held back by the emulated links themselves (docs/performance.md, "Where the CPU goes in
# the compressed ring")? tbf refills its bucket from a timer: when the machine is busy and the timer runs late,
# tokens beyond the bucket are lost and the link runs below its rate. One device call of about 2.5 minutes
# (after benchmarks/gpu_host/prepare.sh here, with ".devtools" carried):   bash benchmarks/gpu_host/burst.sh
# 8 hosts, 64 and 256 MiB allreduces, float32 and bf16 on the wire, with the default bucket (252 KB at
# 10 Gbit/s) and with a 1 MB one (BURSTS="default 1M" by default).
BUDGET=${BUDGET:-300}; . benchmarks/gpu_host/common.sh
for b in ${BURSTS:-default 1M}; do
  arg=""; [ "$b" = default ] || arg="--burst $b"
  timeout $(L 140) python3 benchmarks/allreduce.py --rate 10gbit --hosts 8 --sizes 64M,256M $arg \
    --iters 6 --min-iters 6 --time-budget 4 --timeout 120 --baseline mccl --out "$R/ar8_burst_$b" \
    --series mccl,mccl:MCCL_WIRE_DTYPE=bf16:label=bf16:rtol=3e-2
done
tar czf "$OUT/results.tgz" -C "$R" . && rm -rf "$R"
