#!/usr/bin/env bash
# For a GPU host that lacks ip/tc or LightningCLI's jsonargparse, or reaches no network: run this on a Linux
# x86-64 machine that has them (Debian/Ubuntu) and carry the folder it fills, TOOLS (default build/gpu_host,
# ignored by git like the rest of build/), to the host; run.sh finds it there. It holds ip and tc with their
# libraries and this machine's glibc loader (wrap/ runs them with it, so nothing else on the host sees these
# libraries), and the wheels of jsonargparse. With a commit as argument (prepare.sh COMMIT), also that commit's
# sources in TOOLS/old, the tree run.sh's before-after builds and compares against. A host that has all of this
# needs neither this script nor the folder (before-after then takes OLD_TREE: any checkout of the old commit).
set -euo pipefail
cd "$(dirname "$0")/../.."
D=${TOOLS:-build/gpu_host}
mkdir -p $D/bin $D/lib $D/glibc $D/wrap $D/wheels
cp /usr/sbin/ip /usr/sbin/tc $D/bin/
for b in ip tc; do ldd /usr/sbin/$b | awk '/=>/ {print $3}' | xargs -I{} cp -L {} $D/lib/; done
mv $D/lib/libc.so.6 $D/lib/libm.so.6 $D/glibc/ && cp -L /lib64/ld-linux-x86-64.so.2 $D/glibc/
for b in ip tc; do
  printf '#!/bin/sh\nd=$(dirname "$(readlink -f "$0")")/..\nexec "$d/glibc/ld-linux-x86-64.so.2" --library-path "$d/lib:$d/glibc" "$d/bin/%s" "$@"\n' $b > $D/wrap/$b
  chmod +x $D/wrap/$b
done
python3 -m pip download -q --no-deps -d $D/wheels "jsonargparse[signatures]" docstring-parser typeshed-client
# prepare.sh COMMIT: that commit's sources too, in TOOLS/old, for run.sh before-after to build and compare against
if [ -n "${1:-}" ]; then
  rm -rf $D/old && mkdir -p $D/old && git archive "$1" csrc src setup.py pyproject.toml | tar x -C $D/old
fi
du -sh $D
