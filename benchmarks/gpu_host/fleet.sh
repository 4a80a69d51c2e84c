#!/usr/bin/env bash
# The GPU-host figures of docs/performance.md, in two device calls of under 10 minutes each:
#   bash benchmarks/gpu_host/fleet.sh 1   CUDA tests; 8-host fleet stand-in at batch 32 and 8; bf16 sweeps
#   bash benchmarks/gpu_host/fleet.sh 2   PowerSGD at batch 8; DDP settings at batch 8 and 32; CPU tests
# (after benchmarks/gpu_host/prepare.sh here, with ".devtools" carried). Results under $OUT. Exit code: the
# tests' (pytest's), after results.tgz is written.
BUDGET=565; . benchmarks/gpu_host/common.sh
F="python3 benchmarks/fleet_ddp.py --device cuda --rate 10gbit --steps 6 --warmup 2 --hosts 8"
if [ "$1" = 1 ]; then
  timeout $(L 170) python3 -m pytest -v -p no:cacheprovider tests/torch/test_cuda_no_stall.py \
    tests/torch/test_cuda_staging.py "tests/torch/test_chained_hooks.py::test_powersgd_cuda_8_ranks_identical_weights" \
    > "$OUT/cuda_tests.log" 2>&1
  rc=$?
  tail -25 "$OUT/cuda_tests.log"
  timeout $(L 260) $F --timeout 250 --batch 32 8 --out "$R/fleet8"
  A="python3 benchmarks/allreduce.py --rate 10gbit --sizes 16M,64M,256M --baseline mccl --iters 6 --min-iters 3
     --time-budget 2 --timeout 100 --series mccl,mccl:MCCL_WIRE_DTYPE=bf16:label=mccl-bf16:rtol=3e-2"
  timeout $(L 70) $A --hosts 8 --out "$R/ar8"
  timeout $(L 60) $A --hosts 4 --out "$R/ar4"
else
  timeout $(L 90) $F --batch 8 --series compute,mccl+powersgd --timeout 85 --out "$R/psgd8"
  timeout $(L 130) $F --batch 8 --timeout 125 --out "$R/ddp8" --series compute,mccl,gloo,mccl:bucket=100:label=bucket100,mccl:bucket=5:label=bucket5,mccl:view:label=view,mccl:static:label=static
  timeout $(L 130) $F --batch 32 --timeout 125 --out "$R/ddp32" --series compute,mccl,gloo,mccl:bucket=100:label=bucket100,mccl:view:static:label=view-static
  timeout $(L 200) python3 -m pytest -q -p no:cacheprovider tests/torch/test_chained_hooks.py tests/torch/test_ddp.py \
    > "$OUT/cpu_tests.log" 2>&1
  rc=$?
  tail -15 "$OUT/cpu_tests.log"
fi
tar czf "$OUT/results.tgz" -C "$R" .
exit $rc  # pytest's: a failing test run fails the call, after the results are packed
