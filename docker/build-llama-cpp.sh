#!/usr/bin/env bash
# Builds llama.cpp's shared libraries from the llama.cpp that llama-cpp-python vendors, with one
# backend's CMake flags, and installs llama-cpp-python's Python bindings with exactly those
# libraries in llama_cpp/lib. Runs in the build stage of every server image (docker/*.Dockerfile).
#
# Why not `CMAKE_ARGS=... pip install llama-cpp-python`: its CMakeLists.txt (0.3.36) copies only
# the backend libraries it names into llama_cpp/lib, and names the CANN one `ggml-can`, so
# libggml-cann.so never lands there and libggml.so (RUNPATH $ORIGIN) cannot be loaded. Building
# with CMake here and copying every library the build made does not depend on that list, whichever
# release fixes it. The same recipe ran arbor-server on an H200 (../shared/device/build.sh).
# The source is the pinned release with Arbor's llama.cpp patches applied (llama-cpp-source.sh, which
# stops the build naming a patch that does not apply): no image is ever built unpatched.
#
# Usage: build-llama-cpp.sh [--dry-run] SPEC [CMAKE_ARG...]
#   SPEC       pip requirement for llama-cpp-python: the exact pin, "llama-cpp-python==<patches/llama-cpp-python.version>"
#   CMAKE_ARG  the backend's flags, e.g. -DGGML_CUDA=ON
#   --dry-run  print the CMake configure arguments, one a line, and exit (used by the tests)
# Environment: PIP_INDEX_URL (read by pip), TARGETARCH (set by BuildKit; `uname -m` otherwise),
#   CPU_CMAKE_ARGS (replaces the CPU flags chosen below), BUILD_JOBS (parallel compile jobs;
#   default: every core), and for a CUDA build (-DGGML_CUDA=ON among the CMAKE_ARGs):
#   CUDA_ARCHITECTURES  "default" (real code for the GPUs of data centres and workstations, chosen
#                       from CUDA_VERSION below), "ggml" (ggml's own list), or a CMake list ("89")
#   CUDA_VERSION        the toolkit's version (NVIDIA's images set it), read by "default"
set -euo pipefail

dry_run=0
if [ "${1:-}" = --dry-run ]; then dry_run=1; shift; fi
spec=${1:?usage: build-llama-cpp.sh [--dry-run] SPEC [CMAKE_ARG...]}
shift
python=${PYTHON:-python3}

# CPU flags: never GGML_NATIVE (the image runs on other machines than the one that built it) and
# never AMX, which faults where the kernel or sandbox does not enable it (DEVELOPERS.md).
arch=${TARGETARCH:-$(uname -m)}
case "$arch" in
  amd64|x86_64) default_cpu="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF" ;;
  arm64|aarch64) default_cpu="-DGGML_NATIVE=OFF" ;;
  *) echo "build-llama-cpp: unsupported architecture $arch" >&2; exit 1 ;;
esac
read -ra cpu_args <<<"${CPU_CMAKE_ARGS:-$default_cpu}"

jobs=${BUILD_JOBS:-}
case "$jobs" in
  '') ;;
  *[!0-9]*|0) echo "build-llama-cpp: BUILD_JOBS must be a positive number of jobs, got '$jobs'" >&2; exit 1 ;;
esac

# Real code (SASS) for each GPU generation a data centre or workstation runs: 70 V100, 75 T4,
# 80 A100/A30, 86 RTX 30xx/A10/A40, 89 L4/L40/RTX 40xx, 90 H100/H200, and with CUDA >= 12.8
# 100 B200 and 120 RTX 50xx/RTX PRO (120a: the FP4 tensor-core code ggml uses, as upstream). ggml's
# own default compiles most of these as PTX only, which the driver must JIT-compile on first use
# (minutes at every new container, and impossible on a driver older than the toolkit); PTX of the
# newest architecture is kept for GPUs newer than the toolkit. CUDA 13 dropped Volta (70).
cuda_default_architectures() {
  local major minor list
  IFS=. read -r major minor _ <<<"$1"
  case "$major" in ''|*[!0-9]*) return 1 ;; esac
  case "$minor" in ''|*[!0-9]*) return 1 ;; esac
  list="75-real;80-real;86-real;89-real;90-real"
  [ "$major" -ge 13 ] || list="70-real;$list"
  if [ "$major" -gt 12 ] || { [ "$major" -eq 12 ] && [ "$minor" -ge 8 ]; }; then
    echo "$list;100-real;120a-real;120-virtual"
  else
    echo "$list;90-virtual"
  fi
}

backend_args=("$@")
# (an explicit -DCMAKE_CUDA_ARCHITECTURES among the arguments wins)
if [[ " $* " == *" -DGGML_CUDA=ON "* && " $* " != *" -DCMAKE_CUDA_ARCHITECTURES="* ]]; then
  case "${CUDA_ARCHITECTURES:-default}" in
    ggml) ;;
    default)
      archs=$(cuda_default_architectures "${CUDA_VERSION:-}") || {
        echo "build-llama-cpp: CUDA_ARCHITECTURES=default needs CUDA_VERSION (e.g. 12.6.3), got '${CUDA_VERSION:-}'" >&2
        exit 1
      }
      backend_args+=("-DCMAKE_CUDA_ARCHITECTURES=$archs") ;;
    *) backend_args+=("-DCMAKE_CUDA_ARCHITECTURES=$CUDA_ARCHITECTURES") ;;
  esac
fi

# Only the libraries arbor-server loads (libllama and the ggml libraries it links, and
# libarbor-chat and libarbor-spec, llama.cpp's chat layer and drafters, with the common library they link); no tools, no
# servers, no network at configure time. RUNPATH $ORIGIN lets each library find its siblings in
# llama_cpp/lib without LD_LIBRARY_PATH.
# shellcheck disable=SC2016  # $ORIGIN is for the dynamic linker, not the shell
configure=(
  -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON
  -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON '-DCMAKE_INSTALL_RPATH=$ORIGIN'
  -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
  -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF
  "${cpu_args[@]}" "${backend_args[@]}"
)
if [ "$dry_run" = 1 ]; then printf '%s\n' "${configure[@]}"; exit 0; fi

here=$(cd "$(dirname "$0")" && pwd)
source_script="$here/llama-cpp-source.sh"
[ -f "$source_script" ] || source_script="$here/../scripts/llama-cpp-source.sh"
pinned=$(PYTHON="$python" bash "$source_script" --spec)
if [ "$spec" != "$pinned" ]; then
  echo "build-llama-cpp: asked for '$spec' but the patches are for '$pinned' (patches/llama-cpp-python.version)" >&2
  exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "build-llama-cpp: fetching and patching the source of $spec"
src=$(PYTHON="$python" bash "$source_script" "$work")

echo "build-llama-cpp: cmake ${configure[*]}"
cmake -S "$src/vendor/llama.cpp" -B "$work/build" "${configure[@]}"
cmake --build "$work/build" --parallel "${jobs:-$(nproc)}" --target llama arbor-chat arbor-spec

# The bindings alone: LLAMA_BUILD=OFF makes the package's own CMake build nothing. --no-deps: its
# dependencies (numpy, jinja2, diskcache, typing-extensions) come from the hash-pinned
# requirements/lock.txt, which every Dockerfile installs next.
CMAKE_ARGS=-DLLAMA_BUILD=OFF "$python" -m pip install --no-cache-dir --no-deps "$src"
pkg=$("$python" -c 'import importlib.util; print(importlib.util.find_spec("llama_cpp").submodule_search_locations[0])')
mkdir -p "$pkg/lib"
find "$work/build" -name 'lib*.so*' -not -path '*/CMakeFiles/*' \( -type f -o -type l \) -exec cp -P {} "$pkg/lib/" \;
echo "build-llama-cpp: installed into $pkg/lib:"
ls -l "$pkg/lib"
