#!/usr/bin/env bash
# A change to the 16-bit ring against an older build, in the same run (docs/performance.md, "What holds the
# compressed ring back"). One device call of about 4 minutes, after `benchmarks/gpu_host/prepare.sh OLD_COMMIT`
# here (that commit's sources in .devtools/old), with ".devtools" carried:
#   bash benchmarks/gpu_host/before_after_bf16.sh
# 8 hosts, 64 and 256 MiB: float32 tensors, uncompressed and with bf16 on the wire, then bf16 tensors (what
# torch's bf16 hook hands the engine), each before and after.
OLD=$PWD/.devtools/old
BUDGET=${BUDGET:-400}; . benchmarks/gpu_host/common.sh
( cd "$OLD" && CC=/usr/bin/gcc CXX=/usr/bin/g++ timeout $(L 150) python3 setup.py -q build_ext --inplace \
  > "$OUT/old_build.log" 2>&1 ) || { tail -20 "$OUT/old_build.log"; exit 1; }
A="python3 benchmarks/allreduce.py --rate 10gbit --hosts 8 --sizes 64M,256M --iters 6 --min-iters 6 --time-budget 4 --timeout 100"
W=MCCL_WIRE_DTYPE=bf16
timeout $(L 190) $A --baseline before --out "$R/ar8_wire_bf16" --series \
  mccl:PYTHONPATH=$OLD/src:label=before,mccl:label=after,mccl:$W:PYTHONPATH=$OLD/src:label=bf16-before:rtol=3e-2,\
mccl:$W:label=bf16-after:rtol=3e-2
timeout $(L 100) $A --dtype bfloat16 --baseline before --out "$R/ar8_bf16_tensors" --series \
  mccl:PYTHONPATH=$OLD/src:label=before,mccl:label=after
tar czf "$OUT/results.tgz" -C "$R" . && rm -rf "$R"
