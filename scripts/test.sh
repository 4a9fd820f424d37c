#!/usr/bin/env bash
# Installs what is missing (including the Debian test tools), then runs the whole test suite.
# Extra arguments go to pytest, e.g. scripts/test.sh tests/server -k chat
# The test files run in parallel pytest processes (pytest-xdist, whole files per process so a
# module's server is started once), one per physical core; each process's models get its share
# of the cores (tests/cores.py). ARBOR_TEST_PROCESSES=1 (or `-n 0` among the arguments) runs
# everything in one process. (Handing out the real-model files first measured no gain: 15.2 min
# against 14.4 with xdist's own order, both model files then sharing the cores.)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test-tools
. .venv/bin/activate
processes=${ARBOR_TEST_PROCESSES:-$(python -c 'from server.settings import physical_cores; print(physical_cores())')}
exec python -m pytest -n "$processes" --dist loadfile "$@"
