#!/usr/bin/env bash
# Installs Kanal with its test dependencies, then runs lint, type checks and the whole suite
# (unit, integration against a real Tansu broker, conformance replays, benchmark smoke).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh test
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
.venv/bin/lint-imports --no-cache
# The third-party plugins are checked and tested as their own projects, the way their authors would.
(cd plugins-contrib/kanal-header-injection && MYPYPATH=../../core ../../.venv/bin/mypy src tests \
    && ../../.venv/bin/python -m pytest -q -p no:cacheprovider)
(cd plugins-contrib/kanal-topic-quota && MYPYPATH=../../core ../../.venv/bin/mypy src tests \
    && ../../.venv/bin/python -m pytest -q -p no:cacheprovider)
.venv/bin/python -m pytest -q "$@"
