# fxdp: `make demo` and `make test` work on a fresh Debian 12 machine (root or
# sudo): they install what is missing (scripts/setup.sh), build with CMake +
# Ninja into build/, and never redo work that is already done.
SHELL := /bin/bash
BUILD ?= build
JOBS ?= 2
CMAKE_FLAGS ?=
PY := .venv/bin/python

.PHONY: all setup configure build test test-cpp test-python demo clean

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

demo: build
	@bash scripts/demo.sh

clean:
	rm -rf $(BUILD)
