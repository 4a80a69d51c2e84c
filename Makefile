# The two commands a newcomer needs:
#   make demo   creates .venv, installs torch, Lightning and this package, then fine-tunes the ViT recipe on
#               2 local CPU ranks over loopback (configs/vit_local.yaml)
#   make test   the same setup, then the engine's C++ tests (also under ASan+UBSan) and the pytest suite
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The torch (and matching torchvision) to install into a fresh .venv. Any torch >= 2.6 works, e.g. on a Mac:
#   make demo TORCH_SPEC=torch TORCHVISION_SPEC=torchvision
TORCH_SPEC ?= torch==2.14.1
TORCHVISION_SPEC ?= torchvision==0.29.1
NPROC ?= 4
BIN := $(abspath $(VENV))/bin
CMAKE := $(BIN)/cmake
CMAKE_FLAGS := -G Ninja -DCMAKE_MAKE_PROGRAM=$(BIN)/ninja -DMCCL_BUILD_TESTS=ON

.PHONY: demo bench bench-fleet reliability test test-engine test-sanitize test-tsan test-python build clean fuzz \
  check-macos test-arm64

$(VENV)/.deps: pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q "$(TORCH_SPEC)" "$(TORCHVISION_SPEC)" ninja cmake "setuptools>=64" wheel ziglang
	MCCL_SKIP_EXT=1 $(PY) -m pip install -q --no-build-isolation -e ".[lightning,test,bench]"
	touch $@

build: $(VENV)/.deps
	$(PY) setup.py -q build_ext --inplace

demo: build
	$(PY) examples/vit_finetune.py fit --config configs/vit_local.yaml

# The README's performance tables: mccl vs Gloo (and mpi4py when installed) in the same run, on $(NPROC)
# local ranks; bench-fleet on an emulated 4-host switch (Linux, root). Results under runs/bench/.
bench: build
	$(PY) benchmarks/allreduce.py --nproc $(NPROC)
	$(PY) benchmarks/ddp_vit.py --nproc 2 4

bench-fleet: build
	$(PY) benchmarks/allreduce.py --hosts 4 --rate 1gbit --min 16M --max 256M --step-factor 4 \
	  --series mccl,mccl:MCCL_WIRE_DTYPE=bf16:label=mccl-bf16:rtol=3e-2,gloo
	$(PY) benchmarks/allreduce.py --hosts 4 --rate 10gbit --min 4K --max 256M --step-factor 4
	$(PY) benchmarks/ddp_vit.py --hosts 4 --rate 10gbit --series mccl,mccl:MCCL_WIRE_DTYPE=bf16:label=mccl-bf16,gloo

# The README's reliability figures: fault injection (kill, stop, mismatch, garbage) and the soak.
reliability: build
	mkdir -p runs
	$(PY) benchmarks/faults.py --out runs/faults.json
	$(PY) benchmarks/soak.py --out runs/soak.json

test-engine: $(VENV)/.deps
	$(CMAKE) -S . -B build/engine $(CMAKE_FLAGS) > /dev/null
	$(CMAKE) --build build/engine
	$(BIN)/ctest --test-dir build/engine --output-on-failure

test-sanitize: $(VENV)/.deps
	$(CMAKE) -S . -B build/asan $(CMAKE_FLAGS) \
	  -DCMAKE_BUILD_TYPE=Debug -DMCCL_SANITIZE=address,undefined > /dev/null
	$(CMAKE) --build build/asan
	$(BIN)/ctest --test-dir build/asan --output-on-failure

test-tsan: $(VENV)/.deps
	$(CMAKE) -S . -B build/tsan $(CMAKE_FLAGS) \
	  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMCCL_SANITIZE=thread > /dev/null
	$(CMAKE) --build build/tsan
	$(BIN)/ctest --test-dir build/tsan --output-on-failure

test-python: build
	$(PY) -m pytest tests -q

# Built for the Mac without a Mac (docs/cross_builds.md), with zig. check-macos compiles and links the
# engine, its C++ tests and the torch binding for aarch64-macos, against the macOS arm64 torch wheel (cached
# under build/cross/); nothing runs. MACOS_TORCH_VERSION: the newest torch with a macOS arm64 wheel on PyPI
# (TORCH_SPEC's release has none there). test-arm64 builds the engine for aarch64-linux-musl, checks the
# reduction kernels are NEON code, and builds and runs test_reduce, test_collectives and test_metal_arith under
# qemu-user (installed with apt-get when missing and root).
MACOS_TORCH_VERSION ?= 2.9.1
check-macos: $(VENV)/.deps
	$(PY) tools/cross.py macos --torch-version $(MACOS_TORCH_VERSION)

test-arm64: $(VENV)/.deps
	command -v qemu-aarch64-static > /dev/null || [ "$$(id -u)" != 0 ] || \
	  { apt-get update -q > /dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q qemu-user-static > /dev/null; }
	$(PY) tools/cross.py arm64

test: test-engine test-sanitize check-macos test-arm64 test-python

# libFuzzer on the handshake / frame parsers (needs clang: apt-get install clang). Not part of `make test`
# (which runs the same target through a deterministic driver): make fuzz FUZZ_SECONDS=600
FUZZ_SECONDS ?= 60
fuzz: $(VENV)/.deps
	$(CMAKE) -S . -B build/engine $(CMAKE_FLAGS) > /dev/null
	$(CMAKE) --build build/engine --target fuzz_wire_driver
	CXX=clang++ $(CMAKE) -S . -B build/fuzz -G Ninja -DCMAKE_MAKE_PROGRAM=$(BIN)/ninja -DMCCL_FUZZ=ON \
	  -DCMAKE_BUILD_TYPE=RelWithDebInfo > /dev/null
	$(CMAKE) --build build/fuzz --target fuzz_wire
	mkdir -p build/fuzz/corpus && build/engine/fuzz_wire_driver --write-seeds build/fuzz/corpus
	cd build/fuzz && ./fuzz_wire -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 corpus

clean:
	rm -rf build src/lightning_mccl/*.so
