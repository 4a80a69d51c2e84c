#!/usr/bin/env bash
# Run here (Debian/Ubuntu, x86-64) before a GPU-host call: fills the ignored folder .devtools with what that
# machine lacks (it has torch, Lightning and timm but no ip/tc and no jsonargparse, and reaches no network):
# ip and tc with their libraries and this machine's glibc loader (wrap/ runs them with it, so nothing else
# there sees these libraries), and the wheels of LightningCLI's jsonargparse. With a commit as argument
# (prepare.sh COMMIT), also that commit's sources in .devtools/old, for run.sh's before-after. Then carry
# ".devtools" and call run.sh (README.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
D=.devtools
mkdir -p $D/bin $D/lib $D/glibc $D/wrap $D/wheels
cp /usr/sbin/ip /usr/sbin/tc $D/bin/
for b in ip tc; do ldd /usr/sbin/$b | awk '/=>/ {print $3}' | xargs -I{} cp -L {} $D/lib/; done
mv $D/lib/libc.so.6 $D/lib/libm.so.6 $D/glibc/ && cp -L /lib64/ld-linux-x86-64.so.2 $D/glibc/
for b in ip tc; do
  printf '#!/bin/sh\nd=$(dirname "$(readlink -f "$0")")/..\nexec "$d/glibc/ld-linux-x86-64.so.2" --library-path "$d/lib:$d/glibc" "$d/bin/%s" "$@"\n' $b > $D/wrap/$b
  chmod +x $D/wrap/$b
done
python3 -m pip download -q --no-deps -d $D/wheels "jsonargparse[signatures]" docstring-parser typeshed-client
# prepare.sh COMMIT: that commit's sources too, in .devtools/old, for run.sh before-after to build and compare against
if [ -n "${1:-}" ]; then
  rm -rf $D/old && mkdir -p $D/old && git archive "$1" csrc src setup.py pyproject.toml | tar x -C $D/old
fi
du -sh $D
