#!/usr/bin/env bash
# Regenerates the golden outputs in tests/testdata/golden/ (analysis tables, expansion reports and
# expanded graphs, traced zoo steps) with the built CLI; tests/python/test_goldens.py compares them
# byte for byte. Run after a change meant to alter them, then review `git diff tests/testdata/golden`.
#   scripts/regen_goldens.sh                    every case
#   scripts/regen_goldens.sh --case mlp_adam    one case (repeatable)
# Uses $FXDP_BIN or build/bin/fxdp (`make build` first).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHONPATH="$PWD/client/python${PYTHONPATH:+:$PYTHONPATH}" exec .venv/bin/python tests/python/goldens.py --write "$@"
