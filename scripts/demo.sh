#!/usr/bin/env bash
# `make demo`: runs after setup and build.
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python scripts/demo.py "$@"
