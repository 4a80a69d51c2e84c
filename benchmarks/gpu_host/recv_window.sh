#!/usr/bin/env bash
# Does the receiving side hold back 16-bit traffic (docs/performance.md, "Where the CPU goes in the
# compressed ring")? In one device call of about 4 minutes (after benchmarks/gpu_host/prepare.sh here, with
# ".devtools" carried):   bash benchmarks/gpu_host/recv_window.sh
# Every row also counts each host's TCP losses and closed receive windows (benchmarks/sweep/tcp_counters.py).
# 1. 8 hosts, 64 and 256 MiB allreduces: float32 and bf16 on the wire, with the OS's buffer autotuning and with
#    fixed 8 MiB socket buffers (MCCL_SOCKET_BUFFER_BYTES), and bf16 over two connections per peer;
# 2. the fleet stand-in at batch 8 with torch's bf16 hook (5 MB buckets), the same two buffer settings, and Gloo.
BUDGET=${BUDGET:-560}; . benchmarks/gpu_host/common.sh
A="python3 benchmarks/allreduce.py --rate 10gbit --hosts 8 --sizes 64M,256M --iters 6 --min-iters 6 --time-budget 4 --timeout 120"
W=MCCL_WIRE_DTYPE=bf16 B=MCCL_SOCKET_BUFFER_BYTES=8M
timeout $(L 240) $A --baseline mccl --out "$R/ar8_window" --series \
mccl,mccl:$B:label=sockbuf8M,mccl:$W:label=bf16:rtol=3e-2,mccl:$W:$B:label=bf16-sockbuf8M:rtol=3e-2,\
mccl:$W:MCCL_NSOCKS=2:label=bf16-nsocks2:rtol=3e-2
timeout $(L 250) python3 benchmarks/fleet_ddp.py --device cuda --rate 10gbit --steps ${STEPS:-10} --warmup 2 --hosts 8 \
  --batch 8 --timeout 240 --out "$R/ddp8_window" --series \
  compute,mccl+bf16_hook:bucket=5:label=bf16_hook-bucket5,mccl+bf16_hook:bucket=5:$B:label=bf16_hook-bucket5-sockbuf8M,gloo
tar czf "$OUT/results.tgz" -C "$R" . && rm -rf "$R"
