# fxdp: `make demo` and `make test` work on a fresh Debian 12 machine (root or
# sudo): they install what is missing (scripts/setup.sh), build with CMake +
# Ninja into build/, and never redo work that is already done.
SHELL := /bin/bash
BUILD ?= build
JOBS ?= 2
CMAKE_FLAGS ?=
PY := .venv/bin/python

.PHONY: all setup configure build test test-cpp test-python goldens demo bench bench-build clean

all: build

setup:
	@bash scripts/setup.sh

$(BUILD)/build.ninja: CMakeLists.txt
	cmake -S . -B $(BUILD) -G Ninja $(CMAKE_FLAGS)

configure: setup $(BUILD)/build.ninja

build: configure
	ninja -C $(BUILD) -j$(JOBS)

test-cpp: build
	ctest --test-dir $(BUILD) --output-on-failure -j$(JOBS)

test-python: build
	FXDP_BIN=$(CURDIR)/$(BUILD)/bin/fxdp $(PY) -m pytest tests/python -q

test: test-cpp test-python

# Regenerate tests/testdata/golden/ (tests/python/test_goldens.py compares them byte for byte).
goldens: build
	bash scripts/regen_goldens.sh

demo: build
	@bash scripts/demo.sh

# make bench: every benchmark next to its baseline, measured in the same run
# (bench/run_all.py, ~10 min on 2 cores); writes bench/RESULTS.md and
# bench/results.json, raw outputs under bench/out/latest. Not part of `make test`.
# Builds only what it runs, in Release (BUILD=dir to use another build folder).
BENCH_TARGETS := fxdp fxdp-server fxdp-worker fxdp_pipeline_bench fxdp_compile_load \
	fxdp_allreduce_bench fxdp_executor_bench fxdp_step_bench

bench-build: setup
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release -DFXDP_WITH_TORCH=ON \
	  -DFXDP_BUILD_BENCH=ON $(CMAKE_FLAGS)
	ninja -C $(BUILD) -j$(JOBS) $(BENCH_TARGETS)

bench: bench-build
	$(PY) bench/run_all.py --build $(BUILD)

clean:
	rm -rf $(BUILD)
