#!/usr/bin/env bash
# Applies Arbor's llama.cpp patches (patches/llama.cpp/, the paged attention) to what
# ../shared/device/prepare.sh put in .device/, so the GPU host builds the patched llama.cpp.
# Run it once after prepare.sh, from the project root:  bash bench/device_patch.sh
# A patch that does not apply stops it with the patch's name. Stock llama-server, built on the host
# from the same tree, never turns paged attention on, so it still runs llama.cpp's own attention.
set -euo pipefail
D=.device
if [ ! -f "$D/llama.cpp.tar.gz" ] || [ ! -d "$D/llama_cpp_py" ]; then
  echo "device_patch: run ../shared/device/prepare.sh first" >&2; exit 1
fi
if [ -f "$D/patched" ]; then echo "device_patch: already patched ($(cat "$D/patched"))"; exit 0; fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/vendor"
tar xzf "$D/llama.cpp.tar.gz" -C "$tmp/vendor"
for p in patches/llama.cpp/*.patch; do
  # prepare.sh trims models/docs/media/benches; no patch touches them
  patch -p1 --forward --batch --fuzz=0 --silent -d "$tmp" <"$p" || { echo "device_patch: patch $(basename "$p") does not apply" >&2; exit 1; }
  echo "device_patch: applied $(basename "$p")"
done
tar czf "$D/llama.cpp.tar.gz" -C "$tmp/vendor" llama.cpp
scripts/llama-cpp-source.sh --version > "$D/patched"
echo "device_patch: .device/llama.cpp.tar.gz now holds llama.cpp with paged attention ($(cat "$D/patched"))"
