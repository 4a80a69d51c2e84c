# Sourced on the GPU host from the repository root (prepare.sh copied it to .devtools): ip/tc from the
# carried folder, jsonargparse from its wheels, and the extension built against that machine's torch.
D=$PWD/.devtools
export PATH=$D/wrap:$PATH
ip -V; tc -V
python3 -m pip install -q --no-index --no-deps $D/wheels/*.whl 2>&1 | tail -2
python3 -c "import torch,lightning,timm;print('torch',torch.__version__,'lightning',lightning.__version__,'timm',timm.__version__)"
nproc; nvidia-smi --query-gpu=name,memory.used --format=csv
( CC=/usr/bin/gcc CXX=/usr/bin/g++ python3 -m pip install --no-build-isolation --no-deps -e . > $OUT/build.log 2>&1 ) ||
  { tail -30 $OUT/build.log; return 1; }
echo built
