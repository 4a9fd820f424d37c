#!/usr/bin/env bash
# Checks an installed llama_cpp package: every library its lib/ directory needs is found, and
# `import llama_cpp` (then each MODULE given) works. Every server image runs it in its build stage
# and again in its runtime stage, so a library that was not copied, or a package the runtime image
# lacks, fails the image build with the missing name instead of failing the first request.
#
# Usage: check-llama-cpp.sh [--expect LIB]... [--stubs DIR] [MODULE...]
#   --expect LIB  a library that must be in llama_cpp/lib besides libllama, libggml,
#                 libggml-base, libarbor-chat, libarbor-spec and libllama-common (e.g. ggml-cuda, ggml-cann)
#   --stubs DIR   stand-ins for the libraries only the host's driver provides at run time
#                 (libcuda.so.1, libascend_hal.so); searched after every other directory
#   MODULE        further modules to import after llama_cpp (e.g. server.api.app)
# Environment: PYTHON (default python3).
set -euo pipefail

python=${PYTHON:-python3}
expect=(llama ggml ggml-base arbor-chat arbor-spec llama-common)
stubs=
modules=()
while [ $# -gt 0 ]; do
  case "$1" in
    --expect) expect+=("${2:?--expect needs a library name}"); shift 2 ;;
    --stubs) stubs=${2:?--stubs needs a directory}; shift 2 ;;
    -*) echo "check-llama-cpp: unknown option $1" >&2; exit 2 ;;
    *) modules+=("$1"); shift ;;
  esac
done
fail() { echo "check-llama-cpp: FAIL: $*" >&2; exit 1; }

lib=$("$python" -c 'import importlib.util, os; s = importlib.util.find_spec("llama_cpp"); print(os.path.join(s.submodule_search_locations[0], "lib") if s else "")')
[ -n "$lib" ] || fail "llama_cpp is not installed for $python"
for name in "${expect[@]}"; do
  [ -e "$lib/lib$name.so" ] || fail "$lib has no lib$name.so (it has: $(cd "$lib" 2>/dev/null && echo *.so))"
done
if [ -n "$stubs" ]; then
  [ -d "$stubs" ] || fail "stub directory $stubs does not exist"
  export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$stubs"
fi

missing=()
from_stubs=()
for so in "$lib"/*.so; do
  out=$(ldd "$so") || fail "ldd $so: $out"
  while read -r name _ target _; do
    if [ "$target" = not ]; then
      missing+=("$(basename "$so") needs $name")
    elif [ -n "$stubs" ] && [[ $target == "$stubs"/* ]]; then
      from_stubs+=("$name")
    fi
  done <<<"$out"
done
if [ ${#missing[@]} -gt 0 ]; then
  printf 'check-llama-cpp: not found: %s\n' "${missing[@]}" >&2
  fail "${#missing[@]} libraries not found (a library the build made was not copied into $lib, or the runtime image lacks a package)"
fi
if [ ${#from_stubs[@]} -gt 0 ]; then
  echo "check-llama-cpp: resolved through build-time stubs (the host driver provides them at run time): $(printf '%s\n' "${from_stubs[@]}" | sort -u | tr '\n' ' ')"
fi

"$python" - "${modules[@]}" <<'PY' || fail "import failed (output above)"
import importlib
import sys

import llama_cpp

for module in sys.argv[1:]:
    importlib.import_module(module)
print("check-llama-cpp: ok: llama_cpp", llama_cpp.__version__, "imports" + "".join(", " + m for m in sys.argv[1:]))
PY
