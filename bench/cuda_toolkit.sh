# shellcheck shell=bash
# Sourced by bench/cuda_compile_check.sh and bench/device_prebuild.sh: merges the CUDA toolkit that
# nvcc belongs to with cuBLAS (the PyPI package nvidia-cublas) and a stub libcuda.so into one folder
# CMake's FindCUDAToolkit accepts, on a machine with nvcc but no GPU and no cuBLAS.
#     cuda_toolkit_merge WORK    # prints the merged root (WORK/cuda); NVCC picks the compiler
# Needs nvcc (NVCC, default `nvcc` on PATH): a CUDA 13 toolkit, or the PyPI packages nvidia-cuda-nvcc,
# nvidia-cuda-cccl, nvidia-cuda-runtime, nvidia-cuda-crt and nvidia-nvvm unpacked into one folder.
cuda_toolkit_merge() {
  local work=$1 nvcc_bin toolkit cublas root
  nvcc_bin=$(readlink -f "$(command -v "${NVCC:-nvcc}")") || { echo "cuda_toolkit: no nvcc" >&2; return 1; }
  # a wrapper script (`exec /usr/local/cuda-X/bin/nvcc`) points at the real one
  if head -c 2 "$nvcc_bin" | grep -q '#!'; then nvcc_bin=$(grep -o '/[^ ]*/bin/nvcc' "$nvcc_bin" | head -1); fi
  toolkit=$(dirname "$(dirname "$nvcc_bin")")
  python3 -m pip download --quiet --no-deps -d "$work/whl" "nvidia-cublas>=13,<14" >&2 || return 1
  python3 - "$work" <<'PY' || return 1
import pathlib, sys, zipfile
work = pathlib.Path(sys.argv[1])
with zipfile.ZipFile(next((work / "whl").glob("*.whl"))) as z:
    z.extractall(work / "cublas", members=[n for n in z.namelist() if "/include/" in n or "/lib/" in n])
PY
  cublas=$(dirname "$(dirname "$(find "$work/cublas" -name cublas_v2.h -print -quit)")")
  root="$work/cuda"
  mkdir -p "$root/include" "$root/lib64/stubs"
  ln -s "$toolkit/bin" "$root/bin"; ln -s "$toolkit/nvvm" "$root/nvvm"
  [ -d "$toolkit/targets" ] && ln -s "$toolkit/targets" "$root/targets"
  shopt -s nullglob  # a toolkit has lib64/ (CUDA's installer) or lib/ (the PyPI packages' nvidia/cu13)
  local f lib
  for f in "$toolkit"/include/* "$cublas"/include/*; do ln -sf "$f" "$root/include/"; done
  for f in "$toolkit"/lib64/* "$toolkit"/lib/* "$cublas"/lib/*; do ln -sf "$f" "$root/lib64/"; done
  # the PyPI packages ship versioned names only (libcudart.so.13, libcublas.so.13): CMake looks for the plain ones
  for lib in "$root"/lib64/*.so.*; do [ -e "${lib%.so.*}.so" ] || ln -sf "$lib" "${lib%.so.*}.so"; done
  # named as the driver is, so a library linked against the stub asks for the real one
  echo "" | cc -shared -Wl,-soname,libcuda.so.1 -o "$root/lib64/stubs/libcuda.so" -x c -
  ln -s lib64 "$root/lib"  # the PyPI nvcc's nvcc.profile links from $(TOP)/lib
  echo "$root"
}
