#!/usr/bin/env bash
# Installs what is missing (including Debian's chromium), then runs the whole test suite.
# Extra arguments go to pytest, e.g. scripts/test.sh tests/server -k chat
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --browser
. .venv/bin/activate
exec python -m pytest "$@"
