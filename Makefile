# The two commands a newcomer needs:
#   make demo   creates .venv, installs torch, Lightning and this package, then trains the ViT recipe (from
#               scratch) on 2 local CPU ranks over loopback (configs/vit_local.yaml)
#   make test   the same setup, then the engine's C++ tests (also under ASan+UBSan) and the pytest suite
# and, for the inner loop, make test-quick: the engine's plain C++ tests and the Python tests not marked slow.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The torch (and matching torchvision) to install into a fresh .venv (tested: pyproject.toml tested-torch), e.g. on a Mac:
#   make demo TORCH_SPEC=torch TORCHVISION_SPEC=torchvision
TORCH_SPEC ?= torch==2.14.1
TORCHVISION_SPEC ?= torchvision==0.29.1
NPROC ?= 4
# C++ test binaries ctest runs at once (test-engine, test-sanitize, test-quick): one more than CI's 2 cores,
# since the failure and liveness tests mostly wait on their timeouts (docs/testing.md, *How make test runs*).
CTEST_JOBS ?= 3
BIN := $(abspath $(VENV))/bin
CMAKE := $(BIN)/cmake
CMAKE_FLAGS := -G Ninja -DCMAKE_MAKE_PROGRAM=$(BIN)/ninja -DMCCL_BUILD_TESTS=ON

# The oldest Lightning declared tested (pyproject.toml: [tool.lightning-mccl] tested-lightning): `make test` runs
# LIGHTNING_OLDEST_TESTS against it as well as against the Lightning in $(VENV) (installed without its
# dependencies into build/, first on PYTHONPATH; the rest of the environment is the current one's). Of the
# strategy fits, those through Lightning's own launcher (the strategy as a string, an instance and both
# LightningCLI forms, with the bf16 and PowerSGD hooks): the fixture then starts 2 of its 5 launches.
LIGHTNING_OLDEST ?= 2.5.2
LIGHTNING_OLDEST_DIR := $(abspath build/lightning-$(LIGHTNING_OLDEST))
FITS := tests/lightning/test_strategy_fits.py
LIGHTNING_OLDEST_TESTS ?= $(foreach run,mccl instance cli_string cli_class_path,\
  '$(FITS)::test_fit_over_mccl_equals_lightning_ddp_over_gloo[lightning_mccl-$(run)-LightningEnvironment]') \
  $(FITS)::test_bf16_compress_hook_runs_on_cpu_and_matches_gloo $(FITS)::test_powersgd_runs_and_matches_gloo \
  tests/lightning/test_strategy_arguments.py tests/lightning/test_diloco_strategy.py \
  tests/lightning/test_strategy_mps.py tests/lightning/test_environment.py \
  tests/lightning/test_internals.py::test_the_installed_lightning_passes_the_checks \
  tests/lightning/test_internals.py::test_the_mps_gate_rebinds_nothing_and_other_threads_are_still_refused \
  tests/recipes/test_vit_recipe.py::test_mac_configs_instantiate_with_lightning_cli \
  tests/recipes/test_vit_recipe.py::test_checkpoint_path_loads_backbone_and_makes_a_new_head
# Of the import-order cases (a subprocess each), those of the two strategies' modules: every module runs the
# same registration (lightning_mccl.registration).
LIGHTNING_OLDEST_SKIP ?= $(foreach name,CommMetrics MacFleetEnvironment MCCLDiLoCoStrategy,\
  --deselect 'tests/lightning/test_strategy_arguments.py::test_any_name_imported_first_registers_both_strategy_registries[$(name)]')

.PHONY: demo bench bench-fleet reliability test test-quick test-engine test-sanitize test-tsan test-python test-lightning-oldest \
  build build-engine build-sanitize clean fuzz check-macos test-arm64 cross-toolchains

# The build tools alone (.tools: the engine and the cross builds need nothing more), then torch and the rest.
$(VENV)/.tools: Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q ninja cmake "setuptools>=77" wheel ziglang
	touch $@

$(VENV)/.deps: $(VENV)/.tools pyproject.toml
	$(PY) -m pip install -q "$(TORCH_SPEC)" "$(TORCHVISION_SPEC)"
	MCCL_SKIP_EXT=1 $(PY) -m pip install -q --no-build-isolation -e ".[lightning,test,bench]"
	touch $@

build: $(VENV)/.deps
	$(PY) setup.py -q build_ext --inplace

demo: build
	$(PY) examples/vit_finetune.py fit --config configs/vit_local.yaml

# benchmarks/record/performance.md's tables: mccl vs Gloo (and mpi4py when installed) in the same run, on $(NPROC)
# local ranks; bench-fleet on an emulated 4-host switch (Linux, root). Results under runs/bench/.
# The DDP step on CPU cores: ViT-Small on 32x32 images in 8x8 patches, 4 per rank (benchmarks/fleet_ddp.py).
DDP_CPU := --device cpu --model vit_small_patch16_224 --img-size 32 --patch-size 8 --num-classes 10 --batch 4 \
  --steps 20
bench: build
	$(PY) benchmarks/allreduce.py --nproc $(NPROC)
	$(PY) benchmarks/fleet_ddp.py --nproc 2 4 $(DDP_CPU) --series compute,mccl,gloo

bench-fleet: build
	$(PY) benchmarks/allreduce.py --hosts 4 --rate 1gbit --min 16M --max 256M --step-factor 4 \
	  --series mccl,mccl:MCCL_WIRE_DTYPE=bf16:label=mccl-bf16:rtol=3e-2,gloo
	$(PY) benchmarks/allreduce.py --hosts 4 --rate 10gbit --min 4K --max 256M --step-factor 4
	$(PY) benchmarks/fleet_ddp.py --hosts 4 --rate 10gbit $(DDP_CPU) --series compute,mccl,mccl-bf16,gloo

# benchmarks/record/reliability.md's figures: fault injection (kill, stop, mismatch, garbage) and the soak.
reliability: build
	mkdir -p runs
	$(PY) benchmarks/faults.py --out runs/faults.json
	$(PY) benchmarks/soak.py --out runs/soak.json

test-engine: build-engine
	$(BIN)/ctest --test-dir build/engine --output-on-failure -j $(CTEST_JOBS)

# The sanitizer build runs every case on the smaller buffers of MCCL_TEST_QUICK (the same code paths, the
# threaded reduction included), and fuzz_wire's driver on 50,000 mutated inputs (test-engine: the full sizes
# and 200,000 inputs); at -O0, with the engine compiled in units of 16 files (the plain build keeps one file
# per unit, which checks that each includes what it uses). Why these values: docs/testing.md, *How make test
# runs*.
test-sanitize: build-sanitize
	MCCL_TEST_QUICK=1 $(BIN)/ctest --test-dir build/asan --output-on-failure -j $(CTEST_JOBS)

build-engine: $(VENV)/.tools
	$(CMAKE) -S . -B build/engine $(CMAKE_FLAGS) > /dev/null
	$(CMAKE) --build build/engine

build-sanitize: $(VENV)/.tools
	$(CMAKE) -S . -B build/asan $(CMAKE_FLAGS) \
	  -DCMAKE_BUILD_TYPE=Debug -DMCCL_SANITIZE=address,undefined -DMCCL_FUZZ_ITERATIONS=50000 \
	  -DCMAKE_UNITY_BUILD=ON -DCMAKE_UNITY_BUILD_BATCH_SIZE=16 > /dev/null
	$(CMAKE) --build build/asan

test-tsan: $(VENV)/.tools
	$(CMAKE) -S . -B build/tsan $(CMAKE_FLAGS) \
	  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMCCL_SANITIZE=thread > /dev/null
	$(CMAKE) --build build/tsan
	# intercept_send=0: TSan records what sendmsg read only once the call has returned, when the bytes have left
	# and a peer (a thread of this process) may already have answered into the same buffer; it cannot see that
	# TCP's delivery orders the two (docs/reliability.md, *Fuzzing and sanitizers*). recvmsg's writes stay checked.
	TSAN_OPTIONS="intercept_send=0 $$TSAN_OPTIONS" $(BIN)/ctest --test-dir build/tsan --output-on-failure

# pytest in PYTEST_WORKERS processes (pytest-xdist), each test file in one of them: on 2 cores one worker's
# ranks leave a third of the CPU idle (docs/testing.md, *How make test runs*); then the cases marked alone, in
# one process with the machine to itself. Cases marked slow (pyproject.toml) run in make test, not in make
# test-quick.
PYTEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile
test-python: build
	$(PYTEST) -m "not alone" tests --durations=20
	$(PY) -m pytest -q -m alone tests --durations=5

test-quick: build-engine build
	$(BIN)/ctest --test-dir build/engine --output-on-failure -j $(CTEST_JOBS)
	$(PYTEST) -m "not slow" tests --durations=10

$(LIGHTNING_OLDEST_DIR): $(VENV)/.deps
	$(PY) -m pip install -q --no-deps --upgrade --target $@ "lightning==$(LIGHTNING_OLDEST)"

test-lightning-oldest: build $(LIGHTNING_OLDEST_DIR)
	PYTHONPATH=$(LIGHTNING_OLDEST_DIR) $(PY) -c "import lightning as L; assert L.__version__ == '$(LIGHTNING_OLDEST)', L.__file__"
	PYTHONPATH=$(LIGHTNING_OLDEST_DIR) $(PYTEST) --durations=10 $(LIGHTNING_OLDEST_TESTS) $(LIGHTNING_OLDEST_SKIP)


# Built for the Mac without a Mac (docs/cross_builds.md), with zig. check-macos compiles and links the
# engine, its C++ tests and the torch binding for aarch64-macos, against the macOS arm64 torch wheel (cached
# under build/cross/); nothing runs. MACOS_TORCH_VERSION: the newest torch with a macOS arm64 wheel on PyPI
# (TORCH_SPEC's release has none there). test-arm64 builds the engine for aarch64-linux-musl, checks the
# reduction kernels are NEON code, and builds and runs test_reduce and test_collectives under qemu-user
# (installed with apt-get when missing and root).
MACOS_TORCH_VERSION ?= 2.9.1
check-macos: $(VENV)/.tools
	$(PY) tools/cross.py macos --torch-version $(MACOS_TORCH_VERSION)

test-arm64: $(VENV)/.tools
	command -v qemu-aarch64-static > /dev/null || [ "$$(id -u)" != 0 ] || \
	  { apt-get update -q > /dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q qemu-user-static > /dev/null; }
	$(PY) tools/cross.py arm64


# Torch's install leaves a core idle: zig builds the C++ runtime and musl for arm64 Linux beside it (which
# test-arm64 would otherwise build first; for macOS only compiler-rt, since check-macos links no C++ runtime),
# and the engine's two builds take what the two leave. The engine's tests then run alone: their heartbeat
# timeouts of 0.6 s are missed on a busy machine. The cross builds (zig, mostly one thread each) and the torch
# binding's build share the cores; pytest runs in its workers. Each stage prints its wall time (each stage's
# time on CI's 2 cores: docs/testing.md, *How make test runs*).
ELAPSED = echo "make test: $(1) in $$(( $$(date +%s) - t )) s"
test: $(VENV)/.tools
	t=$$(date +%s); $(MAKE) -j4 $(VENV)/.deps cross-toolchains build-engine build-sanitize && $(call ELAPSED,installs and engine builds)
	t=$$(date +%s); $(MAKE) test-engine test-sanitize && $(call ELAPSED,ctest plain and ASan+UBSan)
	t=$$(date +%s); $(MAKE) -j3 check-macos test-arm64 build && $(call ELAPSED,cross builds and the binding)
	t=$$(date +%s); $(MAKE) test-python && $(call ELAPSED,pytest)
	t=$$(date +%s); $(MAKE) test-lightning-oldest && $(call ELAPSED,the oldest Lightning)

cross-toolchains: $(VENV)/.tools
	$(PY) tools/cross.py toolchains

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
