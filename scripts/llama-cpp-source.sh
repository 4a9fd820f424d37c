#!/usr/bin/env bash
# The llama-cpp-python source Arbor builds: the exactly pinned release (patches/llama-cpp-python.version)
# with Arbor's llama.cpp patches (patches/llama.cpp/*.patch, in name order) applied to the llama.cpp it
# vendors, and its version stamped <release>+arbor.<hash of the patches>. Every build reads this script:
# scripts/setup.sh (the README set-up and CI) and docker/build-llama-cpp.sh (every server image).
# A patch that does not apply stops it with a message naming the patch: there is no unpatched fallback.
# The release archive must match the SHA-256 pinned in patches/llama-cpp-python.sha256 (checked on every
# fetch and every unpack): a tampered or corrupt archive stops it too.
#
# Usage: llama-cpp-source.sh --version      print the stamped version (e.g. 0.3.36+arbor.1a2b3c4d5e6f)
#        llama-cpp-source.sh --spec         print the pip requirement of the pinned release
#        llama-cpp-source.sh --fetch        make sure the release archive is in the cache; print its path
#        llama-cpp-source.sh DIR            fetch it (once), unpack into DIR, patch; print the source dir
#        llama-cpp-source.sh --sdist F DIR  the same from a release archive already at hand (no network)
# Environment: PIP_INDEX_URL (read by pip), PYTHON (default python3), ARBOR_PATCHES (the patches folder;
#   default: patches/ beside this script or one level up), ARBOR_SDIST_CACHE (where fetched archives are
#   kept; default ~/.cache/arbor/sdist).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
patches=${ARBOR_PATCHES:-}
if [ -z "$patches" ]; then
  if [ -d "$here/patches" ]; then patches="$here/patches"; else patches="$here/../patches"; fi
fi
fail() { echo "llama-cpp-source: FAILED: $*" >&2; exit 1; }
[ -f "$patches/llama-cpp-python.version" ] || fail "no $patches/llama-cpp-python.version"
release=$(tr -d '[:space:]' <"$patches/llama-cpp-python.version")
[[ "$release" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || fail "patches/llama-cpp-python.version holds '$release', not one exact release"
shopt -s nullglob
series=("$patches"/llama.cpp/*.patch)
[ "${#series[@]}" -gt 0 ] || fail "no patches in $patches/llama.cpp"
hash=$(cat "${series[@]}" | sha256sum | cut -c1-12)
version="$release+arbor.$hash"

# The archive's pinned SHA-256 (a line "<sha256>  llama_cpp_python-<release>.tar.gz", as sha256sum writes).
verify() {
  local archive=$1 pin="$patches/llama-cpp-python.sha256" want have
  if [ ! -f "$pin" ]; then
    echo "llama-cpp-source: FAILED: no $pin: the release archive's SHA-256 must be pinned" >&2; return 1
  fi
  want=$(awk -v f="llama_cpp_python-$release.tar.gz" '$2 == f {print $1}' "$pin")
  if [ -z "$want" ]; then
    echo "llama-cpp-source: FAILED: $pin pins no SHA-256 for llama_cpp_python-$release.tar.gz" >&2; return 1
  fi
  have=$(sha256sum "$archive" | cut -d' ' -f1)
  if [ "$have" != "$want" ]; then
    echo "llama-cpp-source: FAILED: $archive has SHA-256 $have, not the pinned $want (a corrupt download or a" \
      "changed release: delete it and run again, or pin the new hash after checking the release)" >&2
    return 1
  fi
}

fetch() {
  local cache=${ARBOR_SDIST_CACHE:-$HOME/.cache/arbor/sdist}
  local archive="$cache/llama_cpp_python-$release.tar.gz"
  if [ ! -f "$archive" ]; then
    echo "llama-cpp-source: fetching llama-cpp-python==$release" >&2
    mkdir -p "$cache"
    local tmp; tmp=$(mktemp -d "$cache/.fetch.XXXXXX")
    "${PYTHON:-python3}" -m pip download --quiet --no-deps --no-binary llama-cpp-python --dest "$tmp" \
      "llama-cpp-python==$release" >&2 || { rm -rf "$tmp"; fail "pip could not fetch the source of llama-cpp-python==$release"; }
    verify "$tmp/llama_cpp_python-$release.tar.gz" || { rm -rf "$tmp"; exit 1; }
    mv "$tmp/llama_cpp_python-$release.tar.gz" "$archive" || { rm -rf "$tmp"; fail "pip fetched no llama_cpp_python-$release.tar.gz"; }
    rm -rf "$tmp"
  fi
  verify "$archive" || exit 1
  echo "$archive"
}

case "${1:-}" in
  --version) echo "$version"; exit 0 ;;
  --spec) echo "llama-cpp-python==$release"; exit 0 ;;
  --fetch) fetch; exit 0 ;;
  "") fail "usage: llama-cpp-source.sh --version | --spec | --fetch | [--sdist FILE] DIR" ;;
esac
sdist=
if [ "$1" = --sdist ]; then sdist=${2:?--sdist needs a file}; shift 2; fi
dest=${1:?usage: llama-cpp-source.sh [--sdist FILE] DIR}
mkdir -p "$dest"
command -v patch >/dev/null 2>&1 || fail "the 'patch' tool is missing (Debian package patch)"
[ -n "$sdist" ] || sdist=$(fetch)
[ -f "$sdist" ] || fail "no source archive $sdist"
verify "$sdist" || exit 1
tar xzf "$sdist" -C "$dest"
src="$dest/llama_cpp_python-$release"
[ -d "$src/vendor/llama.cpp" ] || fail "$sdist holds no vendor/llama.cpp"

for p in "${series[@]}"; do
  if ! out=$(patch -p1 --forward --batch --fuzz=0 --silent -d "$src" <"$p" 2>&1); then
    echo "$out" >&2
    fail "patch $(basename "$p") does not apply to llama-cpp-python $release (patches/llama.cpp/; see docs/paged-attention.md, 'A new release')"
  fi
  echo "llama-cpp-source: applied $(basename "$p")" >&2
done
grep -q "^__version__ = \"$release\"" "$src/llama_cpp/__init__.py" || fail "llama_cpp/__init__.py does not say version $release"
sed -i "s/^__version__ = \"$release\"/__version__ = \"$version\"/" "$src/llama_cpp/__init__.py"
echo "$src"
