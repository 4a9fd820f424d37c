#!/usr/bin/env bash
# Installs what is missing (including the Debian test tools), then runs the whole test suite.
# Extra arguments go to pytest, e.g. scripts/test.sh tests/server -k chat
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test-tools
. .venv/bin/activate
exec python -m pytest "$@"
