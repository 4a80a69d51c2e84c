# The two commands a newcomer needs:
#   make demo   creates .venv, installs torch and this package, runs the demo on $(NPROC) local ranks
#   make test   the same setup, then the engine's C++ tests (also under ASan+UBSan) and the pytest suite
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The torch to install into a fresh .venv. Macs: any torch >= 2.6 works (make TORCH_SPEC=torch).
TORCH_SPEC ?= torch==2.14.1
NPROC ?= 4
CMAKE := $(VENV)/bin/cmake

.PHONY: demo test test-engine test-sanitize test-tsan test-python build clean

$(VENV)/.deps: pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)" numpy pytest ninja cmake "setuptools>=64" wheel
	MCCL_SKIP_EXT=1 $(PY) -m pip install -q --no-build-isolation --no-deps -e .
	touch $@

build: $(VENV)/.deps
	$(PY) setup.py -q build_ext --inplace

demo: build
	$(PY) examples/collective_check.py --nproc $(NPROC)

test-engine: $(VENV)/.deps
	$(CMAKE) -S . -B build/engine -G Ninja -DCMAKE_MAKE_PROGRAM=$(VENV)/bin/ninja -DMCCL_BUILD_TESTS=ON > /dev/null
	$(CMAKE) --build build/engine
	cd build/engine && ../../$(VENV)/bin/ctest --output-on-failure

test-sanitize: $(VENV)/.deps
	$(CMAKE) -S . -B build/asan -G Ninja -DCMAKE_MAKE_PROGRAM=$(VENV)/bin/ninja -DMCCL_BUILD_TESTS=ON \
	  -DCMAKE_BUILD_TYPE=Debug -DMCCL_SANITIZE=address,undefined > /dev/null
	$(CMAKE) --build build/asan
	cd build/asan && ../../$(VENV)/bin/ctest --output-on-failure

test-tsan: $(VENV)/.deps
	$(CMAKE) -S . -B build/tsan -G Ninja -DCMAKE_MAKE_PROGRAM=$(VENV)/bin/ninja -DMCCL_BUILD_TESTS=ON \
	  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMCCL_SANITIZE=thread > /dev/null
	$(CMAKE) --build build/tsan
	cd build/tsan && ../../$(VENV)/bin/ctest --output-on-failure

test-python: build
	$(PY) -m pytest tests -q

test: test-engine test-sanitize test-python

clean:
	rm -rf build src/lightning_mccl/*.so
