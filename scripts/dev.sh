#!/usr/bin/env bash
# Installs Kanal and runs the embedded default: a Tansu broker with the gateway in front of it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh dev
exec .venv/bin/kanal dev "$@"
