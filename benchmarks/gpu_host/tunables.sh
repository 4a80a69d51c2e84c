#!/usr/bin/env bash
# The ring's tunables on the emulated 10 Gbit/s switch, float32 and bf16 on the wire, in one device call
# (after benchmarks/gpu_host/prepare.sh here, with ".devtools" carried):
#   bash benchmarks/gpu_host/tunables.sh     about 8 minutes; results in $OUT/results.tgz
# 8 hosts: the DDP bucket sizes (4-64 MiB) with each setting against the defaults and Gloo;
# 8 and 4 hosts: bf16 on the wire at 16-256 MiB against float32, with the sender thread on and off.
BUDGET=560; . benchmarks/gpu_host/common.sh
A="python3 benchmarks/allreduce.py --rate 10gbit --iters 6 --min-iters 3 --time-budget 2 --timeout 170"
timeout $(L 200) $A --hosts 8 --sizes 4M,16M,32M,64M --baseline mccl --out "$R/ar8_tunables" --series \
mccl,mccl:MCCL_CHUNK_BYTES=256K:label=chunk256K,mccl:MCCL_CHUNK_BYTES=1M:label=chunk1M,mccl:MCCL_CHUNK_BYTES=2M:label=chunk2M,\
mccl:MCCL_SOCKET_BUFFER_BYTES=4M:label=sockbuf4M,mccl:MCCL_SEND_THREAD_BYTES=0:label=nosender,\
mccl:MCCL_RING_LOOKAHEAD_BYTES=512M:label=lookahead512M,gloo
B="--sizes 16M,64M,256M --baseline mccl --series mccl,mccl:MCCL_WIRE_DTYPE=bf16:label=bf16:rtol=3e-2,\
mccl:MCCL_WIRE_DTYPE=bf16:MCCL_CHUNK_BYTES=1M:label=bf16-chunk1M:rtol=3e-2,\
mccl:MCCL_WIRE_DTYPE=bf16:MCCL_SEND_THREAD_BYTES=0:label=bf16-nosender:rtol=3e-2"
timeout $(L 200) $A --hosts 8 $B --out "$R/ar8_bf16"
timeout $(L 150) $A --hosts 4 $B --out "$R/ar4_bf16"
tar czf "$OUT/results.tgz" -C "$R" .
