#!/usr/bin/env bash
# run.sh's churn experiment in stages that fit one device call (BUDGET s): the setup (run.sh with no experiment:
# tools, wheels, the extension's build), steady (churn's baseline), churn sized to the time left from steady's
# step time, join, mixed; each a separate benchmarks/churn.py with run.sh's settings, so a stage cut short loses
# only itself. From the repository root: BUDGET=520 R=runs/churn bash benchmarks/results/h100_churn_8members/run_churn.sh
set -u
BUDGET=${BUDGET:-520}; R=${R:-runs/churn}; PY=${PY:-python3}; mkdir -p "$R"
left(){ echo $((BUDGET - SECONDS)); }
[ "${SETUP:-1}" = 1 ] && { OUT=$R/setup bash benchmarks/gpu_host/run.sh > "$R/setup.log" 2>&1; tail -4 "$R/setup.log"; }
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
C="$PY benchmarks/churn.py --device ${DEVICE:-cuda} --model ${MODEL:-vit_base_patch16_224} --members 8 \
--num-samples 512 --global-batch 64 --sample-s 0.05 --leave-every ${LEAVE:-60} --back-after ${BACK:-30} --link-rate 10"
stage(){ local name=$1 cap=$2; shift 2; local l; l=$(left); [ "$cap" -gt "$l" ] && cap=$l
  echo "=== $name: $l s left, cap $cap s: $C $* --out $R/$name"
  [ "$cap" -lt 40 ] && { echo "skipped: too little time"; return; }
  timeout -k 10 "$cap" $C "$@" --timeout $((cap - 5)) --out "$R/$name" > "$R/$name.log" 2>&1
  echo "exit $?"; sed -n '/churn, join and mixed/,$p' "$R/$name.log" | head -30
  [ -f "$R/$name/results.csv" ] || tail -20 "$R/$name.log"; }
stage steady 170 --cases steady --steady-epochs 3
ST=$($PY -c "import csv;print([r for r in csv.DictReader(open('$R/steady/results.csv')) if r['variant']=='elastic'][0]['step_time_median_s'])" 2>/dev/null || echo 1.5)
# churn's length: what is left after join (70 s) and mixed (2 jobs of 30 s + 16 slow steps), its start and end (60 s)
D=$($PY -c "l=$(left);s=float('$ST');d=min(${CHURN_S:-170},l-70-2*(30+16*1.8*s)-60);print(max(3,int(d/(8*1.05*s))))")
echo "steady step $ST s: churn of $D epochs"
stage churn $(( $(left) - 130 )) --cases churn --churn-epochs "$D"
stage join 90 --cases join --epochs 2
stage mixed 200 --cases mixed --epochs 2
echo "=== done, $(left) s left"; du -sh "$R"
