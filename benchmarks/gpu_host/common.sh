# Sourced by the GPU-host scripts (fleet.sh, profile.sh, before_after.sh) from the repository root, with
# BUDGET set to the seconds the call may take: logs to $OUT/log.txt, defines L N (the seconds a step may
# take: N, or what is left of the budget if less), sources .devtools/setup.sh (ip/tc, the extension built
# against the host's torch) and makes $R, the results folder that ends up in $OUT/results.tgz.
set -x
exec > >(tee "$OUT/log.txt") 2>&1
L(){ local t=$((BUDGET-SECONDS)); [ $t -gt $1 ] && t=$1; [ $t -lt 1 ] && t=1; echo $t; }
. .devtools/setup.sh || exit 1
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p "$R"
