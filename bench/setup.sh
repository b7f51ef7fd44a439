#!/usr/bin/env bash
# Installs what the benches need beyond .venv: wrk, the HTTP load generator of api_overhead.
set -euo pipefail
if command -v wrk >/dev/null 2>&1; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "bench/setup.sh: wrk is missing and apt-get is not available; install wrk (https://github.com/wg/wrk)" >&2
    exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq wrk >/dev/null
command -v wrk >/dev/null
