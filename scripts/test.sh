#!/usr/bin/env bash
# Installs Kanal with its test dependencies, then runs lint, type checks and the whole suite
# (unit, integration against a real Tansu broker, conformance replays, benchmark smoke).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh test
.venv/bin/ruff check .
.venv/bin/mypy
.venv/bin/python -m pytest -q "$@"
