#!/usr/bin/env bash
# mccl plan against the fleet stand-in (docs/scaling.md), after benchmarks/gpu_host/prepare.sh here, with
# ".devtools" carried; three device calls of up to 10 minutes:
#   PART=profiles bash benchmarks/gpu_host/plan.sh          # ViT-B/16 on cuda, batch 8 and 32, with 4, 8 and 16
#                                                           # processes sharing the GPU, as the stand-in's ranks
#   PART=fleet HOSTS="4 8" bash benchmarks/gpu_host/plan.sh # the stand-in at 4 and 8 hosts, batch 32 and 8
#   PART=fleet HOSTS=16 bash benchmarks/gpu_host/plan.sh    # and at 16
# Every method's series in the same processes: DDP (the strategy's 5 MB buckets), torch's bf16 hook, PowerSGD as
# the strategy runs it (rank 1, one bucket, batched); EXTRA=",mccl+int8:bucket=5,mccl+diloco" adds the series of
# issue 27's methods once fleet_ddp has them (their labels as its --series spells them). Then, here:
#   python benchmarks/plan_vs_measured.py --measured R/fleet_h4 R/fleet_h8 R/fleet_h16 --profile R/profile_*.json
BUDGET=${BUDGET:-580}; . benchmarks/gpu_host/common.sh
case ${PART:?PART=profiles or PART=fleet} in
profiles)
  for b in 8 32; do for n in 4 8 16; do
    timeout $(L 150) python3 -m lightning_mccl.cli plan --model vit_base_patch16_224 --batch $b --device cuda \
      --share-device $n --hosts 1-48 --save-profile "$R/profile_b${b}_share${n}.json" --out "$R/plan_b${b}_share${n}"
  done; done ;;
fleet)
  for n in ${HOSTS:?HOSTS=\"4 8\" or 16}; do
    timeout $(L 560) python3 benchmarks/fleet_ddp.py --device cuda --rate 10gbit --hosts $n --batch 32 8 \
      --warmup 3 --steps 8 --powersgd-rank 1 --timeout 280 --out "$R/fleet_h$n" \
      --series compute,mccl:bucket=5,mccl+bf16_hook:bucket=5,mccl+powersgd_batched:bucket=1000${EXTRA:-}
  done ;;
esac
tar czf "$OUT/results.tgz" -C "$R" . && rm -rf "$R"
