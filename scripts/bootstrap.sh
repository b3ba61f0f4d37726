#!/usr/bin/env bash
# Creates .venv (if missing) and installs Kanal with the given extras, from the repo's own files.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-dev}"
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
# OpenSSL's headers: the encryption plugin's compiled AEADs and field passes are built against them
# (without them the install goes on with the slower Python path).
if [ ! -f /usr/include/openssl/evp.h ] && command -v apt-get >/dev/null; then
    apt-get install -y -qq libssl-dev >/dev/null 2>&1 \
        || { apt-get update -qq && apt-get install -y -qq libssl-dev >/dev/null; } \
        || echo "bootstrap: libssl-dev not installed; encryption runs on its Python path" >&2
fi
.venv/bin/python -m pip install --quiet -e ".[${extras}]"
if [ "$extras" = "test" ]; then
    # socat: the L4 relay the request-rate benchmark (and its smoke test) compares the gateway with.
    if ! command -v socat >/dev/null; then
        apt-get install -y -qq socat >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq socat >/dev/null; }
    fi
    # chromium and chromium-driver: the console's browser tests (Selenium drives them; nothing downloads a browser).
    if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
        apt-get install -y -qq chromium chromium-driver >/dev/null 2>&1 \
            || { apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null; }
    fi
    .venv/bin/python -m pip install --quiet -e "plugins-contrib/kanal-header-injection[test]"
    .venv/bin/python -m pip install --quiet -e "plugins-contrib/kanal-topic-quota[test]"
fi
