#!/usr/bin/env bash
# A refactor's check on the GPU host, in one device call of under 10 minutes: the CUDA tests, the 4-rank
# loopback allreduce sweep of the tree against an older build in the same run, and the 8-host fleet
# stand-in at batch 8 (mccl against Gloo). After benchmarks/gpu_host/prepare.sh OLD_COMMIT here (which puts
# that commit's sources in .devtools/old), with ".devtools" carried:
#   bash benchmarks/gpu_host/before_after.sh
# Results under $OUT (results.tgz, log.txt, cuda_tests.log); exit code: the CUDA tests' (pytest's), after
# results.tgz is written. Not run there yet: the older build took more than the whole call when built next to
# the new one (gVisor), so it now builds after it, within 4 minutes.
OLD=$PWD/.devtools/old
BUDGET=575; . benchmarks/gpu_host/common.sh
( cd "$OLD" && CC=/usr/bin/gcc CXX=/usr/bin/g++ timeout $(L 240) python3 setup.py -q build_ext --inplace \
  > "$OUT/old_build.log" 2>&1 ) || { tail -20 "$OUT/old_build.log"; exit 1; }
timeout $(L 200) python3 -m pytest -v -p no:cacheprovider tests/torch/test_cuda_no_stall.py \
  tests/torch/test_cuda_staging.py ${CUDA_TESTS:-} \
  "tests/torch/test_chained_hooks.py::test_powersgd_cuda_8_ranks_identical_weights" > "$OUT/cuda_tests.log" 2>&1
rc=$?
tail -25 "$OUT/cuda_tests.log"
timeout $(L 170) python3 benchmarks/allreduce.py --nproc 4 --sizes 4K,64K,1M,16M,64M,256M \
  --series "mccl:PYTHONPATH=$OLD/src:label=before,mccl:label=after,gloo" --baseline before \
  --iters 10 --min-iters 3 --warmup 2 --time-budget 2 --timeout 160 --out "$R/ar4_before_after"
timeout $(L 150) python3 benchmarks/fleet_ddp.py --device cuda --rate 10gbit --steps 8 --warmup 2 --hosts 8 \
  --batch 8 --series compute,mccl,gloo --timeout 140 --out "$R/fleet8_b8"
tar czf "$OUT/results.tgz" -C "$R" .
exit $rc  # pytest's: a failing CUDA test run fails the call, after the results are packed
