#!/usr/bin/env bash
# Installs a Python >= 3.11 (what pyproject.toml requires) from the distribution's packages of an
# Ubuntu/Debian image that ships none (NVIDIA's CUDA images), and prints the interpreter's path.
# Ubuntu 24.04's python3 is 3.12; Ubuntu 22.04's is 3.10, so there it installs the python3.11
# package (universe), which lets the CUDA image build on ubuntu22.04 for older CUDA releases
# (CUDA_UBUNTU, docs/deploy.md). The build and runtime stages run it on the same base, so the
# virtual environment made with the printed interpreter finds the same one at run time.
#
# Usage: install-python.sh [--dev]   --dev: also venv and headers (the build stage)
set -euo pipefail

dev=0
[ "${1:-}" = --dev ] && dev=1
# apt's output goes to stderr (the build log): stdout carries only the interpreter's path.
exec 3>&1 1>&2
export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y --no-install-recommends python3
if python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  python=python3
else
  python=python3.11
  apt-get install -y --no-install-recommends python3.11 \
    || { echo "install-python: this base has Python $(python3 -V) and no python3.11 package; use CUDA_UBUNTU=ubuntu22.04 or ubuntu24.04" >&2; exit 1; }
fi
if [ "$dev" = 1 ]; then
  apt-get install -y --no-install-recommends "$python-venv" "$python-dev"
fi
rm -rf /var/lib/apt/lists/*
command -v "$python" >&3
