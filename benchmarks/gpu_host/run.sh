#!/usr/bin/env bash
# The GPU host's experiments, by name (benchmarks/gpu_host/README.md; the record, benchmarks/record/, cites each
# one next to its figures). On a Linux host with an NVIDIA GPU, torch, Lightning and timm, as root for the
# emulated switch, from the repository root:
#   bash benchmarks/gpu_host/run.sh EXPERIMENT [EXPERIMENT ...]
# runs the experiments in order into $OUT (default runs/gpu_host): results.tgz (a folder per launch), log.txt,
# and a log per test run. Exit code: the first failing test run's, else 0; a benchmark that fails or runs out of
# time shows in log.txt and leaves what it measured.
#
# Time: every step has a limit sized for its default settings (the first number of its py/tests call below, in
# seconds), multiplied by LIMIT_SCALE (1). BUDGET (unset: none) caps the whole run at that many seconds, each
# step getting what is left if that is less: for a machine lent for a fixed time.
# Tools: a host without ip/tc or LightningCLI's jsonargparse gets them from TOOLS (build/gpu_host), which
# `bash benchmarks/gpu_host/prepare.sh` fills on a machine that has them; OLD_TREE (TOOLS/old) is the tree
# before-after compares against (prepare.sh OLD_COMMIT).
#
# Experiments, and the variables that change them (defaults in parentheses):
#   cuda-tests      the CUDA tests, the 8-bit codec's and DiLoCo's 16-bit cast on the device among them (TESTS:
#                   more test files)
#   fleet8 fleet16  the fleet stand-in, N ranks each on an emulated 10 Gbit/s host, ViT-B/16 on the shared GPU
#                   (BATCH 8, STEPS 12, SERIES: the strategy's choices, Gloo, and DDP's 25 MB buckets); named
#                   twice (fleet24 fleet24), the repeat's folder ends with its start time
#   powersgd        PowerSGD as the strategy runs it (one bucket, batched) at rank 1 and 4 (BATCH 8)
#   buckets         DDP bucket sizes over mccl and Gloo (BATCH 32)
#   wire            allreduce, float32 against each of WIRES on the wire (bf16), on HOSTS hosts (8 4)
#   before-after    this tree against OLD_TREE (prepare.sh OLD_COMMIT) in the same launches, 8 hosts:
#                   float32 and each of WIRES on the wire (SIZES 1M,4M,16M,64M,256M), then bf16 tensors;
#                   NEW_WIRES: wire types only this tree has, run on it alone
#   int8            the 8-bit allreduce (docs/int8.md): the stand-in at BATCH (8) against the bf16 hooks
#   ops8            allreduce_int8 against float32 and bf16 on the wire, all-to-all and reduce-scatter, 8 hosts
#   stagger         the all-to-all's schedules (MCCL_ALLTOALL_WINDOW), 8 hosts, SIZES (4M,16M,64M,256M): every peer
#                   at once (all) against the pairwise exchange with 1, 2 and 4 rounds in flight (w1 w2 w4), and 2
#                   gated on sends alone (s2: MCCL_ALLTOALL_WINDOW_GATE=send)
#   int8algo        the 8-bit allreduce's two algorithms (MCCL_INT8_ALGO: exchange, ring; docs/int8.md): the
#                   collective on HOSTS hosts (8 4, SIZES 1M,4M,16M,64M,256M), then the stand-in at 8 hosts,
#                   BATCH (8), DDP's 25 MB buckets, each against mccl and Gloo with the bf16 hook
#   tunables        the ring's settings at DDP's bucket sizes, 8 hosts
#   profile         every thread's CPU while the stand-in trains (thread_cpu.py)
#   congestion      allreduce under each TCP congestion control the kernel has (root; restores it)
#   burst           the emulated links' token bucket (BURSTS: default 1M)
#   algos           the algorithm table (csrc/engine/algorithms/select.cc): latency algorithms against rings
#                   (CPUS: a taskset list for the ranks, e.g. 0-15; unset: every CPU)
#   sender nsocks   4 ranks on loopback: the sender thread, and connections per peer
#   convergence     python3 benchmarks/convergence.py --device cuda --out DIR $CONVERGENCE_ARGS
#   finetune        convergence.py --finetune with ViT-S: the model pretrained once (finetune_pretrain), then SEEDS
#                   (0 1 2 3) in two halves, two processes of 8 ranks side by side (finetune_seedsAB, each with
#                   ddp-fp32 first), METHODS (diloco-h4-frag4-olr3: names in benchmarks/accuracy/methods.py), or
#                   METHOD: one method not in that table, as convergence.py's --method NAME=JSON
#   diloco-sim      benchmarks/diloco_sim.py's sweep of DiLoCo's settings (SIM_RUNS: benchmarks/accuracy/
#                   diloco_sweep.txt, SEEDS: 0 1 2, SIM_JOBS: 8 processes on the GPU); SIM_DIR: a folder kept
#                   between calls (e.g. runs/diloco_sim) to resume a sweep cut by the budget, else a fresh one
#   plan-profiles   mccl plan's profiles of ViT-B/16 on cuda, batch 8 and 32, with N processes sharing the GPU
#                   for N in HOSTS (4 8 16), as the stand-in's N ranks (benchmarks/record/scaling.md)
#   churn           benchmarks/churn.py: MEMBERS (8) members sharing the GPU over loopback, ViT-B/16 with AdamW,
#                   SAMPLE_S (0.05) s of emulated compute per sample, a leave every 60 s and back 30 s later over
#                   CHURN_EPOCHS (30) epochs; the join's heal against a 10 Gbit/s link's transfer time
#   plan-fleetN     the stand-in at N hosts, batch 32 and 8, every bucketed method of mccl plan (DDP, bf16
#                   hook, int8, PowerSGD rank 1) and Gloo + bf16 hook; plan-dilocoN: DiLoCo (DILOCO:
#                   mccl-bf16+diloco:H=8)
# SYNC (device) is what ends a stand-in's timed step (fleet_ddp.py --sync: device, or stream, the compute stream).
# CONGESTION (cubic) is the emulated hosts' TCP congestion control; WIRE_RTOL (3e-2) the tolerance of the
# wire types' results against float64.
set -x
OUT=${OUT:-runs/gpu_host}
TOOLS=$(realpath -m "${TOOLS:-build/gpu_host}")
OLD_TREE=$(realpath -m "${OLD_TREE:-$TOOLS/old}")
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
R=$OUT/r; mkdir -p "$R"
rc=0

# L N: the seconds a step may take: N x LIMIT_SCALE, or what is left of BUDGET if less; T N: a launch's own
# limit inside it.
L(){ local t=$(( $1 * ${LIMIT_SCALE:-1} ))
  if [ -n "${BUDGET:-}" ]; then local left=$((BUDGET - SECONDS)); [ $left -lt $t ] && t=$left; fi
  [ $t -lt 1 ] && t=1; echo $t; }
T(){ local t=$(L $1); echo $((t > 10 ? t - 5 : t)); }
py(){ local cap=$1; shift; timeout -k 30 $(L $cap) python3 "$@"; }
tests(){ local name=$1 cap=$2; shift 2
  timeout $(L $cap) python3 -m pytest -v -p no:cacheprovider "$@" > "$OUT/$name.log" 2>&1 || { local r=$?; [ $rc = 0 ] && rc=$r; }
  tail -25 "$OUT/$name.log"; }
# build DIR LOG: the extension of the tree at DIR, against this machine's torch, with the system's compiler
# (BUILD_CC, BUILD_CXX), not the host's CC and CXX: the project's host sets them to a newer g++ in /opt/gcc, whose
# build of the extension segfaults in ProcessGroupMCCL's constructor under torch's libstdc++.
build(){
  ( cd "$1" && CC=${BUILD_CC:-/usr/bin/gcc} CXX=${BUILD_CXX:-/usr/bin/g++} MAX_JOBS=${MAX_JOBS:-$(nproc)} timeout $(L 300) \
    python3 setup.py -q build_ext --inplace > "$2" 2>&1 ) || { tail -30 "$2"; exit 1; }; }
left(){ [ -n "${BUDGET:-}" ] && echo "$((BUDGET - SECONDS)) s left" || echo "$SECONDS s in"; }

# ip and tc from TOOLS (wrapped with their own loader), jsonargparse from its wheels, where prepare.sh made them.
if [ -d "$TOOLS/wrap" ]; then export PATH=$TOOLS/wrap:$PATH; fi
if compgen -G "$TOOLS/wheels/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps "$TOOLS"/wheels/*.whl 2>&1 | tail -2
fi
ip -V; tc -V; nproc; nvidia-smi --query-gpu=name,memory.used --format=csv
python3 -c "import torch,lightning,timm;print('torch',torch.__version__,'lightning',lightning.__version__,'timm',timm.__version__)"
build . "$OUT/build.log"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1

C="--congestion ${CONGESTION:-cubic}"
F="benchmarks/fleet_ddp.py --device cuda --rate 10gbit $C --warmup 2 --sync ${SYNC:-device}"
A0="benchmarks/allreduce.py --rate 10gbit --iters 6 --min-iters 6 --time-budget 3"
A="$A0 $C"
wire(){ echo "mccl:MCCL_WIRE_DTYPE=$1${2:+:PYTHONPATH=$2/src}:label=$1${3:-}:rtol=${WIRE_RTOL:-3e-2}"; }  # TYPE [OLD_TREE LABEL_END]
wires(){ local s=mccl; for w in ${WIRES:-bf16} ${NEW_WIRES:-}; do s+=",$(wire $w)"; done; echo "$s"; }

for experiment in "$@"; do
  echo "=== $experiment: $(left)"
  case $experiment in
  cuda-tests)
    tests cuda_tests 240 tests/torch/test_cuda_no_stall.py tests/torch/test_cuda_staging.py \
      tests/torch/test_cuda_in_place.py tests/torch/test_chained_hooks.py tests/torch/test_wire_compression.py \
      tests/torch/test_int8_codec.py tests/torch/test_int8.py tests/lightning/test_diloco.py ${TESTS:-} ;;
  fleet[0-9]*)
    n=${experiment#fleet}
    o=$R/fleet${n}_b${BATCH:-8}; [ -e "$o" ] && o+=_$(date +%H%M)  # a repeat in the same call keeps both
    py 300 $F --hosts $n --steps ${STEPS:-12} --batch ${BATCH:-8} --timeout $(T 300) --out "$o" \
      --series ${SERIES:-compute,mccl:bucket=5:label=mccl,mccl+bf16_hook:bucket=5:label=mccl-bf16,gloo,mccl:label=mccl-25MB} ;;
  powersgd)
    for r in 1 4; do
      py 100 $F --hosts 8 --steps 6 --batch ${BATCH:-8} --powersgd-rank $r --timeout $(T 100) \
        --out "$R/powersgd_b${BATCH:-8}_r$r" --series compute,mccl+powersgd_batched:bucket=1000:label=powersgd-r$r
    done ;;
  buckets)
    py 280 $F --hosts 8 --steps 10 --batch ${BATCH:-32} --timeout $(T 280) --out "$R/buckets_b${BATCH:-32}" \
      --series compute,mccl,gloo,mccl:bucket=5:label=mccl-bucket5,gloo:bucket=5:label=gloo-bucket5,mccl:bucket=2:label=mccl-bucket2 ;;
  wire)
    for h in ${HOSTS:-8 4}; do
      py 120 $A --hosts $h --sizes ${SIZES:-16M,64M,256M} --baseline mccl --timeout $(T 120) --out "$R/wire_${h}hosts" \
        --series $(wires)
    done ;;
  before-after)
    O=$OLD_TREE; [ -d "$O" ] || { echo "no $O: run prepare.sh OLD_COMMIT first (or set OLD_TREE)"; exit 1; }
    build "$O" "$OUT/old_build.log"
    B="mccl:PYTHONPATH=$O/src:label=before,mccl:label=after"
    for w in ${WIRES:-bf16}; do B+=",$(wire $w "$O" -before),$(wire $w "" -after)"; done
    for w in ${NEW_WIRES:-}; do B+=",$(wire $w "" -after)"; done
    py 300 $A --hosts 8 --sizes ${SIZES:-1M,4M,16M,64M,256M} --baseline before --timeout $(T 300) \
      --out "$R/before_after_8hosts" --series $B
    py 150 $A --hosts 8 --sizes ${SIZES:-1M,4M,16M,64M,256M} --dtype bfloat16 --baseline before --timeout $(T 150) \
      --out "$R/before_after_bf16_tensors_8hosts" --series "mccl:PYTHONPATH=$O/src:label=before,mccl:label=after" ;;
  int8)
    py 330 $F --hosts 8 --steps ${STEPS:-12} --batch ${BATCH:-8} --timeout $(T 330) --out "$R/int8_fleet8_b${BATCH:-8}" \
      --series compute,mccl+bf16_hook:bucket=5:label=mccl-bf16,mccl+int8:bucket=5:label=mccl-int8,mccl+int8:bucket=25:label=mccl-int8-25MB,gloo+bf16_hook:label=gloo-bf16 ;;
  ops8)
    py 200 $A --hosts 8 --op allreduce,allreduce_int8,alltoall,reduce_scatter --sizes 4M,16M,64M,256M --baseline mccl \
      --timeout $(T 200) --out "$R/int8_ops_8hosts" --series $(wires) ;;
  stagger)
    py 240 $A --hosts 8 --op alltoall --sizes ${SIZES:-4M,16M,64M,256M} --baseline all --timeout $(T 240) \
      --out "$R/stagger_8hosts" --series mccl:label=all,mccl:MCCL_ALLTOALL_WINDOW=1:label=w1,\
mccl:MCCL_ALLTOALL_WINDOW=2:label=w2,mccl:MCCL_ALLTOALL_WINDOW=4:label=w4,\
mccl:MCCL_ALLTOALL_WINDOW=2:MCCL_ALLTOALL_WINDOW_GATE=send:label=s2 ;;
  int8algo)
    for h in ${HOSTS:-8 4}; do
      py 150 $A --hosts $h --op allreduce_int8 --sizes ${SIZES:-1M,4M,16M,64M,256M} --baseline exchange \
        --timeout $(T 150) --out "$R/int8algo_${h}hosts" \
        --series mccl:MCCL_INT8_ALGO=exchange:label=exchange,mccl:MCCL_INT8_ALGO=ring:label=ring
    done
    py 330 $F --hosts 8 --steps ${STEPS:-12} --batch ${BATCH:-8} --timeout $(T 330) --out "$R/int8algo_fleet8_b${BATCH:-8}" \
      --series compute,mccl+int8:bucket=25:MCCL_INT8_ALGO=exchange:label=int8-exchange,mccl+int8:bucket=25:MCCL_INT8_ALGO=ring:label=int8-ring,mccl+bf16_hook:bucket=5:label=mccl-bf16,gloo+bf16_hook:label=gloo-bf16 ;;
  tunables)
    py 200 $A --hosts 8 --sizes 4M,16M,32M,64M --baseline mccl --timeout $(T 200) --out "$R/tunables_8hosts" --series \
mccl,mccl:MCCL_CHUNK_BYTES=256K:label=chunk256K,mccl:MCCL_CHUNK_BYTES=1M:label=chunk1M,mccl:MCCL_CHUNK_BYTES=2M:label=chunk2M,\
mccl:MCCL_SOCKET_BUFFER_BYTES=4M:label=sockbuf4M,mccl:MCCL_SEND_THREAD_BYTES=0:label=nosender,\
mccl:MCCL_RING_LOOKAHEAD_BYTES=512M:label=lookahead512M,gloo ;;
  profile)
    for run in "mccl32 32 compute,mccl" "gloo32 32 compute,gloo" "mccl8 8 compute,mccl" "bf16w8 8 compute,mccl-bf16"; do
      read -r name batch series <<< "$run"
      py 120 benchmarks/gpu_host/thread_cpu.py --match fleet_ddp.py --interval 0.5 --out "$R/profile_$name.cpu.csv" -- \
        python3 $F --hosts 8 --steps 10 --batch $batch --series $series --timeout $(T 120) --out "$R/profile_$name"
    done ;;
  congestion)
    P=/proc/sys/net/ipv4; was=$(cat $P/tcp_congestion_control)
    for cc in $(cat $P/tcp_available_congestion_control); do
      echo $cc > $P/tcp_congestion_control
      for h in 4 8; do
        py 90 $A0 --congestion system --hosts $h --sizes 64M,256M --iters 12 --min-iters 12 --baseline mccl \
          --timeout $(T 90) --out "$R/congestion_${h}hosts_$cc" --series mccl
      done
    done
    echo $was > $P/tcp_congestion_control ;;
  burst)
    for b in ${BURSTS:-default 1M}; do
      arg=""; [ "$b" = default ] || arg="--burst $b"
      py 140 $A --hosts 8 --sizes 64M,256M $arg --baseline mccl \
        --timeout $(T 140) --out "$R/burst_$b" --series $(wires)
    done ;;
  algos)
    LAT=mccl:MCCL_ALGO=rd:MCCL_BROADCAST_ALGO=tree:MCCL_REDUCE_ALGO=tree:MCCL_ALLGATHER_ALGO=bruck:MCCL_REDUCE_SCATTER_ALGO=rd:label=latency
    RING=mccl:MCCL_ALGO=ring:MCCL_BROADCAST_ALGO=ring:MCCL_REDUCE_ALGO=ring:MCCL_ALLGATHER_ALGO=ring:MCCL_REDUCE_SCATTER_ALGO=ring:label=ring
    for w in 4 8; do
      timeout $(L 230) ${CPUS:+taskset -c $CPUS} python3 benchmarks/allreduce.py --nproc $w --op allreduce,broadcast,reduce,allgather,reduce_scatter \
        --min 4K --max 4M --step-factor 2 --series $LAT,$RING --baseline ring --iters 8 --min-iters 3 --warmup 2 \
        --time-budget 0.6 --timeout $(T 230) --out "$R/algos_W$w"
    done ;;
  sender)
    py 280 benchmarks/allreduce.py --nproc 4 --sizes 4K,64K,1M,4M,16M,64M,256M --iters 10 --min-iters 3 --warmup 2 \
      --time-budget 2 --timeout $(T 280) --out "$R/sender_4ranks" --series mccl,mccl:MCCL_SEND_THREAD_BYTES=0:label=mccl-1thread,gloo ;;
  nsocks)
    py 280 benchmarks/allreduce.py --nproc 4 --sizes 4K,1M,16M,64M,256M --iters 10 --min-iters 3 --warmup 2 \
      --time-budget 2 --timeout $(T 280) --out "$R/nsocks_4ranks" \
      --series mccl:MCCL_SEND_THREAD_BYTES=0:label=1-thread,mccl,mccl:MCCL_NSOCKS=2:label=nsocks2,mccl:MCCL_NSOCKS=4:label=nsocks4,gloo ;;
  convergence)
    py 550 benchmarks/convergence.py --device cuda --out "$R/convergence" ${CONVERGENCE_ARGS:-} ;;
  finetune)
    V="--model vit_small_patch16_224 --model-kwargs {} --finetune"
    py 200 benchmarks/convergence.py --device cuda --out "$R/finetune_pretrain" $V --pretrain-only
    seeds=(${SEEDS:-0 1 2 3}); half=$(( (${#seeds[@]} + 1) / 2 ))
    sel=(--methods "${METHODS:-diloco-h4-frag4-olr3}"); [ -z "${METHOD:-}" ] || sel=(--method "$METHOD")
    pids=()
    for part in "${seeds[*]:0:half}" "${seeds[*]:half}"; do
      [ -z "$part" ] || py 900 benchmarks/convergence.py --device cuda --out "$R/finetune_seeds${part// /}" $V \
        "${sel[@]}" --seeds $part & pids+=($!)
    done
    wait "${pids[@]}" ;;  # not a bare wait: that waits for the log's tee too
  diloco-sim)
    d=${SIM_DIR:-$R/diloco_sim}
    py 570 benchmarks/diloco_sim.py --device cuda --jobs ${SIM_JOBS:-8} --runs-file ${SIM_RUNS:-benchmarks/accuracy/diloco_sweep.txt} \
      --seeds ${SEEDS:-0 1 2} --timeout $(T 555) --out "$d"
    [ "$d" = "$R/diloco_sim" ] || cp -r "$d" "$R/diloco_sim" ;;
  plan-profiles)
    for b in 8 32; do for n in ${HOSTS:-4 8 16}; do
      py 150 -m lightning_mccl.cli plan --model vit_base_patch16_224 --batch $b --device cuda --share-device $n \
        --hosts 1-48 --save-profile "$R/plan_profile_b${b}_share$n.json" --out "$R/plan_b${b}_share$n"
    done; done ;;
  churn)
    py 1200 benchmarks/churn.py --device cuda --model vit_base_patch16_224 --members ${MEMBERS:-8} \
      --num-samples 512 --global-batch 64 --epochs 2 --churn-epochs ${CHURN_EPOCHS:-30} --sample-s ${SAMPLE_S:-0.05} \
      --leave-every 60 --back-after 30 --link-rate 10 --timeout $(T 400) --out "$R/churn" ;;
  plan-fleet[0-9]*)
    n=${experiment#plan-fleet}
    py 560 $F --hosts $n --steps 8 --batch 32 8 --powersgd-rank 1 --timeout $(T 560) --out "$R/plan_fleet$n" \
      --series compute,mccl:bucket=5,mccl+bf16_hook:bucket=5,mccl+int8:bucket=25,mccl+powersgd_batched:bucket=1000,gloo+bf16_hook ;;
  plan-diloco[0-9]*)
    n=${experiment#plan-diloco}
    py 300 $F --hosts $n --warmup 8 --steps 24 --batch 32 8 --timeout $(T 300) --out "$R/plan_diloco$n" \
      --series compute,${DILOCO:-mccl-bf16+diloco:H=8} ;;
  *) echo "unknown experiment $experiment (see the head of $0)"; rc=2 ;;
  esac
done
tar czf "$OUT/results.tgz" -C "$R" . && rm -rf "$R"
exit $rc
