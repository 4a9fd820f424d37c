#!/usr/bin/env bash
# Replaces the stock llama.cpp that ../shared/device/prepare.sh put in .device/ with the one Arbor
# builds (scripts/llama-cpp-source.sh: the pinned release with every patch in patches/llama.cpp/
# applied), so a GPU host that compiles (../shared/device/build.sh) builds the patched llama.cpp.
# Run it once after prepare.sh, from the project root:  bash bench/device_patch.sh
# Then build on the host with libarbor-chat and libarbor-spec (the server's chat layer and drafters, native/tools/)
# among the targets:
#     TARGETS="llama mtmd arbor-chat arbor-spec llama-server llama-bench" bash .device/build.sh llama-1b q8_0
# (bench/device_prebuild.sh compiles here instead and saves the host that compile.) Stock
# llama-server, built from the same tree, never turns paged attention on, so it still runs
# llama.cpp's own attention.
set -euo pipefail
D=.device
if [ ! -f "$D/llama.cpp.tar.gz" ] || [ ! -d "$D/llama_cpp_py" ]; then
  echo "device_patch: run ../shared/device/prepare.sh first" >&2; exit 1
fi
version=$(scripts/llama-cpp-source.sh --version)
if [ "$(cat "$D/patched" 2> /dev/null)" = "$version" ]; then echo "device_patch: already patched ($version)"; exit 0; fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
vendor=$(scripts/llama-cpp-source.sh "$tmp/src")/vendor
# as prepare.sh trims it: no patch touches these
rm -rf "$vendor/llama.cpp/models" "$vendor/llama.cpp/docs" "$vendor/llama.cpp/media" "$vendor/llama.cpp/benches"
tar czf "$D/llama.cpp.tar.gz" -C "$vendor" llama.cpp
echo "$version" > "$D/patched"
echo "device_patch: .device/llama.cpp.tar.gz now holds llama.cpp with Arbor's patches ($version)"
