#!/usr/bin/env bash
# Lint and type check, as configured in pyproject.toml ([tool.ruff], [tool.mypy]): .ci/run runs it
# first, .pre-commit-config.yaml before each commit. Only `ruff check`: the code is not run through
# a formatter.
# Usage: scripts/lint.sh          ruff check ., then mypy (the project's .venv: scripts/setup.sh)
#        scripts/lint.sh ruff     ruff only. Without .venv/bin/ruff, ruff alone is installed from
#                                 requirements/dev-lock.txt (hash-checked, seconds) into a throwaway
#                                 venv, so .ci/run lints before its long set-up
#        scripts/lint.sh mypy     mypy only (needs .venv: it reads the installed packages' types)
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
fail() { echo "lint: FAILED: $*" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

run_ruff() {
  local ruff=.venv/bin/ruff
  if [ ! -x "$ruff" ]; then
    # the lock's ruff entry: its line and the --hash lines after it
    awk '/^ruff==/ {p = 1; print; next} p && /^ +--hash/ {print; next} {p = 0}' requirements/dev-lock.txt >"$work/ruff.txt"
    [ -s "$work/ruff.txt" ] || fail "no ruff in requirements/dev-lock.txt"
    python3 -m venv "$work/venv"
    "$work/venv/bin/pip" install -q --disable-pip-version-check --no-deps --require-hashes -r "$work/ruff.txt" \
      || fail "installing ruff from requirements/dev-lock.txt"
    ruff="$work/venv/bin/ruff"
  fi
  echo "lint: $("$ruff" --version) check ."
  "$ruff" check . || fail "ruff check (the rules: pyproject.toml [tool.ruff]; 'ruff check --fix' fixes the ones marked [*])"
}

run_mypy() {
  [ -x .venv/bin/mypy ] || fail "no .venv/bin/mypy: run scripts/setup.sh"
  echo "lint: $(.venv/bin/mypy --version) (the packages: pyproject.toml [tool.mypy] files)"
  .venv/bin/mypy || fail "mypy"
}

case "$what" in
  all) run_ruff; run_mypy ;;
  ruff) run_ruff ;;
  mypy) run_mypy ;;
  *) echo "usage: scripts/lint.sh [ruff|mypy]" >&2; exit 2 ;;
esac
