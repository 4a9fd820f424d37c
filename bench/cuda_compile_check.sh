#!/usr/bin/env bash
# Compile-only check of the CUDA side of our llama.cpp patches on a machine without a GPU: the
# paged kernels (ggml-cuda/fattn-paged.cu), the flash-attention dispatch that calls them (fattn.cu) and the
# MMA kernel's 64-column tiles, whose sparse gather runs a paged prefill (template-instances/fattn-mma-f16-*),
# built by llama.cpp's own CMake from the patched source scripts/llama-cpp-source.sh prepares.
# Needs nvcc (NVCC, default `nvcc` on PATH): a CUDA 13 toolkit, or the PyPI packages nvidia-cuda-nvcc,
# nvidia-cuda-cccl, nvidia-cuda-runtime, nvidia-cuda-crt and nvidia-nvvm unpacked into one folder
# (`pip download --no-deps` them, unzip the wheels, chmod +x nvidia/cu13/bin/* nvidia/cu13/nvvm/bin/*;
# NVCC=<folder>/nvidia/cu13/bin/nvcc); cuBLAS comes
# from the PyPI package nvidia-cublas, and a stub libcuda.so stands in for the driver (nothing is
# linked or run).
#     bash bench/cuda_compile_check.sh [ARCHS]     # default "75;80;86;89;90" (CUDA 13 has no 70)
set -euo pipefail
archs=${1:-75;80;86;89;90}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
src=$(scripts/llama-cpp-source.sh "$work/src")/vendor/llama.cpp
# shellcheck disable=SC1091  # sourced from beside this script
. "$(dirname "$0")/cuda_toolkit.sh"
root=$(cuda_toolkit_merge "$work")  # the toolkit with cuBLAS and a driver stub merged in
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=$archs" \
  -DCMAKE_CUDA_COMPILER="$root/bin/nvcc" -DCUDAToolkit_ROOT="$root" -DGGML_NATIVE=OFF -DGGML_CUDA_NCCL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF \
  -DLLAMA_CURL=OFF > "$work/cmake.log" || { tail -30 "$work/cmake.log"; exit 1; }
# the MMA kernel's 64-column tiles, which the paged prefill's gather adds template cases to (the topic "ggml-cuda: paged flash attention")
mma64=()
for t in ncols1_64-ncols2_1 ncols1_32-ncols2_2 ncols1_16-ncols2_4 ncols1_8-ncols2_8; do
  mma64+=("template-instances/fattn-mma-f16-instance-$t.cu.o")
done
echo "cuda_compile_check: fattn-paged.cu, fattn.cu and the MMA kernel's 64-column tiles for $archs"
make -C "$work/build/ggml/src/ggml-cuda" fattn-paged.cu.o fattn.cu.o "${mma64[@]}"
echo "cuda_compile_check: ok ($("$root/bin/nvcc" --version | tail -1))"
