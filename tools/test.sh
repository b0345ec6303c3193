#!/usr/bin/env bash
# Set up everything (tools/bootstrap.sh) and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/bootstrap.sh
exec .venv/bin/python -m pytest -q "$@"
