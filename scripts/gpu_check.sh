#!/usr/bin/env bash
# The GPU check of issue 28 (docs/gpu.md), one command per place:
#
#   scripts/gpu_check.sh --pack       here: write .gpukit/ (the Debian packages the worker's
#                                     build needs, the zoo and GPT-2 graphs traced with .venv's
#                                     torch, their N=2 expansions); needs build/bin/fxdp
#   scripts/gpu_check.sh              on the lent GPU machine (the device tool's `run`, with
#                                     carry [".gpukit"]): builds fxdp-worker and the gpu tests
#                                     against that machine's torch, runs every step, writes
#                                     gpu_report.md/.json, build.log and steps.log to $OUT
#   scripts/gpu_check.sh --dry-run    here, on the CPU: the same build and steps against another
#                                     LibTorch (FXDP_DRY_TORCH_DIR, default the torch 2.11 wheel
#                                     unpacked in /work/scratch-torch211; else .venv's torch
#                                     folder), its dependencies from .gpukit/ only
#
# Other arguments go to bench/gpu/gpu_check.py (--steps zoo,gpt2, --skip-compile, ...).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
KIT=${FXDP_GPU_KIT:-$ROOT/.gpukit}

mode=device
if [[ "${1:-}" == "--pack" ]]; then mode=pack; shift
elif [[ "${1:-}" == "--dry-run" ]]; then mode=dry; shift
fi

case $mode in
pack)
  [[ -x build/bin/fxdp ]] || { echo "gpu_check: --pack needs build/bin/fxdp (make build)" >&2; exit 2; }
  rm -rf "$KIT"
  PYTHONPATH=$ROOT/client/python exec .venv/bin/python bench/gpu/pack.py --out "$KIT" \
    --fxdp build/bin/fxdp "$@"
  ;;
dry)
  TORCH_DIR=${FXDP_DRY_TORCH_DIR:-/work/scratch-torch211/torch}
  [[ -d "$TORCH_DIR/lib" ]] || TORCH_DIR=$(.venv/bin/python -c 'import os, torch; print(os.path.dirname(torch.__file__))')
  LD=""
  if [[ -e "$TORCH_DIR/lib/libtorch_cuda.so" ]]; then
    # A CUDA wheel's libtorch_cpu needs libcudart and libcupti (the nvidia-* wheels next to it
    # on the device; here the CUDA toolkit's).
    for d in ${FXDP_DRY_CUDA_LIB:-} /usr/local/cuda/lib64 /usr/local/cuda-13.0/lib /usr/local/cuda/lib; do
      if [[ -n "$d" && -e "$d/libcudart.so.13" ]]; then LD=$d; break; fi
    done
  fi
  [[ -f "$KIT/manifest.json" ]] || { echo "gpu_check: no $KIT/manifest.json: run --pack first" >&2; exit 2; }
  exec .venv/bin/python bench/gpu/gpu_check.py --dry-run --kit "$KIT" --torch-dir "$TORCH_DIR" \
    ${LD:+--ld-path "$LD"} --build "$ROOT/build-gpukit-dry" --jobs "${JOBS:-1}" \
    --timing-steps 3 --gpt2-case gpt2_tiny --out "${OUT:-$ROOT/build-gpukit-dry/out}" "$@"
  ;;
device)
  [[ -f "$KIT/manifest.json" ]] || { echo "gpu_check: no $KIT/manifest.json (carry .gpukit)" >&2; exit 2; }
  export PYTHONUNBUFFERED=1
  exec python3 bench/gpu/gpu_check.py --kit "$KIT" --build "$ROOT/build-gpukit" \
    --out "${OUT:-$ROOT/build-gpukit/out}" "$@"
  ;;
esac
