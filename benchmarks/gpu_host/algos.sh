#!/usr/bin/env bash
# Every algorithm choice of algorithms/select.cc, measured: one device call of under 8 minutes on the GPU host
# (16 cores), from the repository root:
#   bash benchmarks/gpu_host/algos.sh            results under $OUT (default: runs/algos)
# Per world size (4 ranks: 4 cores each; 8 ranks: 2 cores each; loopback, pinned to cores 0-15), one launch
# sweeps allreduce, broadcast, reduce, allgather and reduce_scatter from 4 KiB to 4 MiB (float32) with every
# latency-optimal algorithm forced (series "latency": rd, tree, tree, bruck, rd) against every ring (series
# "ring"); each results.md row says by how much the latency algorithm beat the ring (vs ring above 1: faster).
# The table's crossover for a collective at a world size is the largest size where "latency" is still faster.
set -x
OUT=${OUT:-runs/algos}
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
B=470; L(){ local t=$((B-SECONDS)); [ $t -gt $1 ] && t=$1; [ $t -lt 1 ] && t=1; echo $t; }
nproc; python3 -c "import torch; print('torch', torch.__version__)"
( MAX_JOBS=16 CC=/usr/bin/gcc CXX=/usr/bin/g++ python3 setup.py -q build_ext --inplace > "$OUT/build.log" 2>&1 ) ||
  { tail -30 "$OUT/build.log"; exit 1; }
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
LAT=mccl:MCCL_ALGO=rd:MCCL_BROADCAST_ALGO=tree:MCCL_REDUCE_ALGO=tree:MCCL_ALLGATHER_ALGO=bruck:MCCL_REDUCE_SCATTER_ALGO=rd:label=latency
RING=mccl:MCCL_ALGO=ring:MCCL_BROADCAST_ALGO=ring:MCCL_REDUCE_ALGO=ring:MCCL_ALLGATHER_ALGO=ring:MCCL_REDUCE_SCATTER_ALGO=ring:label=ring
A="taskset -c 0-15 python3 benchmarks/allreduce.py --op allreduce,broadcast,reduce,allgather,reduce_scatter
   --min 4K --max 4M --step-factor 2 --series $LAT,$RING --baseline ring
   --iters 8 --min-iters 3 --warmup 2 --time-budget 0.6"
timeout $(L 200) $A --nproc 4 --timeout 190 --out "$OUT/algos_W4"
timeout $(L 230) $A --nproc 8 --timeout 220 --out "$OUT/algos_W8"
for w in 4 8; do [ -f "$OUT/algos_W$w/results.md" ] && cat "$OUT/algos_W$w/results.md"; done
