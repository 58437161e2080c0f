# fxdp: `make demo` and `make test` work on a fresh Debian 12 machine (root or
# sudo): they install what is missing (scripts/setup.sh), build with CMake +
# Ninja into build/, and never redo work that is already done.
SHELL := /bin/bash
BUILD ?= build
JOBS ?= 2
CMAKE_FLAGS ?=
PY := .venv/bin/python

.PHONY: all setup configure build test test-cpp test-python test-asan asan-build fuzz-build fuzz fuzz-smoke \
	goldens demo bench bench-build llama-check clean format lint

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

# The torch-free code (ir, analysis, expansion, server, util, their tests) built
# with clang under ASan + UBSan in its own folder, and the libFuzzer targets of
# tests/fuzz/ (docs/robustness.md). `make test` runs the sanitized ctest
# (`make test-asan`) and the fuzzers for FUZZ_SMOKE_S seconds; `make fuzz` for
# FUZZ_S.
ASAN_BUILD ?= build-asan
FUZZ_S ?= 1800
FUZZ_SMOKE_S ?= 60

$(ASAN_BUILD)/build.ninja: CMakeLists.txt
	cmake -S . -B $(ASAN_BUILD) -G Ninja -DCMAKE_CXX_COMPILER=clang++-14 -DFXDP_SANITIZE=ON \
	  -DFXDP_WITH_TORCH=OFF -DFXDP_BUILD_BENCH=OFF

asan-build: setup $(ASAN_BUILD)/build.ninja
	ninja -C $(ASAN_BUILD) -j$(JOBS)

fuzz-build: setup $(ASAN_BUILD)/build.ninja
	ninja -C $(ASAN_BUILD) -j$(JOBS) fxdp fxdp_graph_fuzzer fxdp_text_fuzzer

test-asan: asan-build
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --test-dir $(ASAN_BUILD) --output-on-failure -j$(JOBS)

fuzz-smoke: fuzz-build
	bash tests/fuzz/run.sh $(ASAN_BUILD) $(FUZZ_SMOKE_S)

fuzz: fuzz-build
	bash tests/fuzz/run.sh $(ASAN_BUILD) $(FUZZ_S)

test: lint test-cpp test-python test-asan fuzz-smoke

# The tree's style: .clang-format (C++) and ruff.toml (Python), both pinned in
# scripts/setup.sh. `make format` rewrites the files; `make lint` (CI) checks them.
CXX_SOURCES = git ls-files '*.cc' '*.h' '*.cu' | grep -v '^third_party/'

format: setup
	$(CXX_SOURCES) | xargs .venv/bin/clang-format -i
	.venv/bin/ruff check --fix -q .
	.venv/bin/ruff format -q .

lint: setup
	$(CXX_SOURCES) | xargs .venv/bin/clang-format --dry-run --Werror
	.venv/bin/ruff check -q .
	.venv/bin/ruff format --check -q .

# Regenerate tests/testdata/golden/ (tests/python/test_goldens.py compares them byte for byte).
goldens: build
	bash scripts/regen_goldens.sh

demo: build
	@bash scripts/demo.sh

# make bench: every benchmark next to its baseline, measured in the same run
# (bench/run_all.py, ~28 min on 2 cores); writes bench/RESULTS.md and
# bench/results.json, raw outputs under bench/out/latest. Not part of `make test`.
# Builds only what it runs, in Release (BUILD=dir to use another build folder).
BENCH_TARGETS := fxdp fxdp-server fxdp-worker fxdp_pipeline_bench fxdp_compile_load \
	fxdp_allreduce_bench fxdp_executor_bench fxdp_random_bench fxdp_step_bench fxdp_shape_bench

bench-build: setup
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release -DFXDP_WITH_TORCH=ON \
	  -DFXDP_BUILD_BENCH=ON $(CMAKE_FLAGS)
	ninja -C $(BUILD) -j$(JOBS) $(BENCH_TARGETS)

bench: bench-build
	$(PY) bench/run_all.py --build $(BUILD)

# make llama-check: issue 27's Done means (bench/llama300m_check.py, `make bench`'s
# area 9 on its own, merged into bench/RESULTS.md): a 297 M Llama from a sharded
# save_pretrained checkpoint, FULLY_SHARD on 2 workers, client and server RSS, equal
# to eager PyTorch, resumed on 1 REPLICATE rank, fxdp export. ~10 min, ~20 GB of disk.
llama-check: bench-build
	$(PY) bench/run_all.py --build $(BUILD) --areas llama --merge

clean:
	rm -rf $(BUILD)
