#!/usr/bin/env bash
# Installs Kanal with its test dependencies, then runs lint, type checks and the whole suite
# (unit, integration against a real Tansu broker, conformance replays, benchmark smoke).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh test
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
# The third-party plugin is checked and tested as its own project, the way its authors would.
(cd plugins-contrib/kanal-header-injection && MYPYPATH=../../core ../../.venv/bin/mypy src tests \
    && ../../.venv/bin/python -m pytest -q -p no:cacheprovider)
.venv/bin/python -m pytest -q "$@"
