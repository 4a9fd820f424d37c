#!/usr/bin/env bash
# The llama-cpp-python source Arbor builds, and the one place that owns Arbor's llama.cpp series:
#   - the exactly pinned release (patches/llama-cpp-python.version), its archive checked against the SHA-256
#     pinned in patches/llama-cpp-python.sha256 on every fetch and every unpack;
#   - native/: the C/C++/CUDA that is wholly Arbor's, real source files mirroring vendor/llama.cpp/ (native/X is
#     copied to vendor/llama.cpp/X), copied into the tree before any patch;
#   - patches/llama.cpp/*.patch: a few topics in `git format-patch` form (From, Subject, what and why), applied
#     in name order with `git am -3`; they only hook native/ in and change llama.cpp's own files.
# The version is stamped <release>+arbor.<hash of the topics and native/>. Every build reads this script:
# scripts/setup.sh (the README set-up and CI), docker/build-llama-cpp.sh (every server image) and the device
# scripts in bench/. A topic that does not apply stops it, naming the topic: there is no unpatched fallback.
#
# Usage: llama-cpp-source.sh --version           print the stamped version (e.g. 0.3.36+arbor.1a2b3c4d5e6f)
#        llama-cpp-source.sh --spec              print the pip requirement of the pinned release
#        llama-cpp-source.sh --fetch             make sure the release archive is in the cache; print its path
#        llama-cpp-source.sh [--sdist F] DIR     unpack the release (F, or fetched once) into DIR, copy native/,
#                                                apply the topics, stamp the version; print the source dir
#        llama-cpp-source.sh --tree [--sdist F] DIR
#                                                the same as a git working tree to change the series in: a commit
#                                                of the release, one of native/ (tag arbor-native), then one commit
#                                                per topic; not stamped (DEVELOPERS.md, "Changing llama.cpp")
#        llama-cpp-source.sh --regenerate SRC    the reverse: write patches/llama.cpp/ from SRC's topic commits
#                                                (arbor-native..HEAD) and copy SRC's native files back to native/
# Environment: PIP_INDEX_URL (read by pip), PYTHON (default python3), ARBOR_PATCHES (the patches folder;
#   default: patches/ beside this script or one level up), ARBOR_NATIVE (the native sources; default: native/
#   beside the patches folder), ARBOR_SDIST_CACHE (where fetched archives are kept; default ~/.cache/arbor/sdist).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
patches=${ARBOR_PATCHES:-}
if [ -z "$patches" ]; then
  if [ -d "$here/patches" ]; then patches="$here/patches"; else patches="$here/../patches"; fi
fi
native=${ARBOR_NATIVE:-$(dirname "$patches")/native}
fail() { echo "llama-cpp-source: FAILED: $*" >&2; exit 1; }
[ -f "$patches/llama-cpp-python.version" ] || fail "no $patches/llama-cpp-python.version"
release=$(tr -d '[:space:]' <"$patches/llama-cpp-python.version")
[[ "$release" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || fail "patches/llama-cpp-python.version holds '$release', not one exact release"
shopt -s nullglob
series=("$patches"/llama.cpp/*.patch)
# (--regenerate writes the series, so only it may start from none)
[ "${#series[@]}" -gt 0 ] || [ "${1:-}" = --regenerate ] || fail "no patches in $patches/llama.cpp"
# native/'s files, relative to it, sorted (C locale: the same order on every machine)
native_files=()
if [ -d "$native" ]; then
  mapfile -t native_files < <(cd "$native" && find . -type f ! -name README.md -printf '%P\n' | LC_ALL=C sort)
fi
# The stamp covers everything the build takes from the repository: each topic, each native file and its path.
hash=$({
  [ "${#series[@]}" -eq 0 ] || cat "${series[@]}"
  for f in "${native_files[@]}"; do printf '%s\n' "native/$f"; cat "$native/$f"; done
} | sha256sum | cut -c1-12)
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

# git over the unpacked source, with a fixed identity and dates: the commits it makes (and so the topics
# --regenerate writes from a tree nobody changed) are the same on every machine. The release archive carries
# llama-cpp-python's own .git, with llama.cpp as a submodule (vendor/llama.cpp/.git): git would take that
# folder for another repository and add none of its files. A --tree is a repository of its own (those two
# are dropped); a build keeps them as the archive has them and runs git with a repository beside the source.
export GIT_AUTHOR_DATE="2000-01-01T00:00:00Z" GIT_COMMITTER_DATE="2000-01-01T00:00:00Z"
git_dir=
git_in() {
  local where=(-C "$1")
  [ -z "$git_dir" ] || where=(--git-dir="$git_dir" --work-tree="$1")
  git "${where[@]}" -c user.name=Arbor -c user.email=arbor@localhost -c core.autocrlf=false -c core.abbrev=12 \
    -c init.defaultBranch=main -c commit.gpgsign=false -c core.hooksPath=/dev/null "${@:2}"
}

# Make $1 (an unpacked release) a git repository whose first commit is the release: every file with --tree
# (any file may become a topic's), only the files the topics touch otherwise (what `git am -3` needs; seconds
# instead of committing 200 MB of vocabularies).
commit_release() {
  local src=$1 mode=$2
  command -v git >/dev/null 2>&1 || fail "git is missing (it applies the topics: git am -3)"
  git_in "$src" init -q
  if [ "$mode" = tree ]; then
    git_in "$src" add -f -A .
  else
    local paths=() existing=() p
    mapfile -t paths < <(sed -n 's|^diff --git a/\(.*\) b/.*$|\1|p' "${series[@]}" | LC_ALL=C sort -u)
    for p in "${paths[@]}"; do [ -e "$src/$p" ] && existing+=("$p"); done
    [ "${#existing[@]}" -eq 0 ] || git_in "$src" add -f -- "${existing[@]}"
  fi
  git_in "$src" commit -q --allow-empty -m "llama-cpp-python $release (the pinned release)"
}

# Copy native/ into vendor/llama.cpp/. A native file that the release already has would silently replace
# llama.cpp's own: refused (change llama.cpp's files through a topic).
copy_native() {
  local src=$1 f
  for f in "${native_files[@]}"; do
    [ ! -e "$src/vendor/llama.cpp/$f" ] || fail "native/$f would replace llama.cpp's own vendor/llama.cpp/$f"
    mkdir -p "$(dirname "$src/vendor/llama.cpp/$f")"
    cp "$native/$f" "$src/vendor/llama.cpp/$f"
  done
}

apply_topics() {
  local src=$1 mode=$2 p out next
  if [ "$mode" = tree ]; then
    # one `git am` for the whole series, left in progress where a topic does not apply (a new release):
    # resolve it in the tree, `git add`, `git am --continue` applies the rest (DEVELOPERS.md)
    if ! out=$(git_in "$src" am -3 --quiet "${series[@]}" 2>&1); then
      echo "$out" >&2
      next=$(git_in "$src" rev-parse --git-path rebase-apply/next)
      case "$next" in /*) ;; *) next="$src/$next" ;; esac
      next=$(cat "$next" 2>/dev/null || echo 1)
      fail "patch $(basename "${series[$((next - 1))]}") does not apply to llama-cpp-python $release: the tree $src is left" \
        "mid-series (git am --show-current-patch=diff; resolve, git add, git am --continue; then --regenerate)"
    fi
    return
  fi
  for p in "${series[@]}"; do
    if ! out=$(git_in "$src" am -3 --quiet "$p" 2>&1); then
      echo "$out" >&2
      git_in "$src" am --abort >/dev/null 2>&1 || true
      fail "patch $(basename "$p") does not apply to llama-cpp-python $release (patches/llama.cpp/; see DEVELOPERS.md, 'Changing llama.cpp')"
    fi
    echo "llama-cpp-source: applied $(basename "$p")" >&2
  done
}

unpack() {
  local sdist=$1 dest=$2
  [ -n "$sdist" ] || sdist=$(fetch)
  [ -f "$sdist" ] || fail "no source archive $sdist"
  verify "$sdist" || exit 1
  mkdir -p "$dest"
  tar xzf "$sdist" -C "$dest"
  local src="$dest/llama_cpp_python-$release"
  [ -d "$src/vendor/llama.cpp" ] || fail "$sdist holds no vendor/llama.cpp"
  echo "$src"
}

regenerate() {
  local src=$1 f changed added dirty out
  git_in "$src" rev-parse -q --verify arbor-native >/dev/null 2>&1 \
    || fail "$src is not a tree made by 'llama-cpp-source.sh --tree' (no tag arbor-native)"
  # native sources are edited as files, never patched: a topic commit touching one would put them in a patch
  changed=$(git_in "$src" diff --name-only arbor-native HEAD)
  for f in "${native_files[@]}"; do
    if grep -qxF "vendor/llama.cpp/$f" <<<"$changed"; then
      fail "a topic commit changes vendor/llama.cpp/$f, a native source: leave that edit uncommitted (it is copied back to native/$f)"
    fi
  done
  added=$(git_in "$src" diff --name-only --diff-filter=A arbor-native HEAD)
  [ -z "$added" ] || fail "a topic adds new files (new code of Arbor's belongs in native/, mirroring vendor/llama.cpp/): $added"
  dirty=$(git_in "$src" status --porcelain --untracked-files=no | sed 's/^...//')
  for f in "${native_files[@]}"; do dirty=$(grep -vxF "vendor/llama.cpp/$f" <<<"$dirty" || true); done
  [ -z "$dirty" ] || fail "uncommitted changes outside native/ (commit them into their topic first): $dirty"
  out=$(mktemp -d)
  git_in "$src" format-patch -q --zero-commit --no-signature --no-numbered --full-index -o "$out" arbor-native..HEAD
  rm -f "$patches"/llama.cpp/*.patch
  mv "$out"/*.patch "$patches/llama.cpp/"
  rmdir "$out"
  for f in "${native_files[@]}"; do cp "$src/vendor/llama.cpp/$f" "$native/$f"; done
  echo "llama-cpp-source: wrote $(find "$patches/llama.cpp" -name '*.patch' | wc -l) topics to $patches/llama.cpp and copied ${#native_files[@]} native files back" >&2
}

sdist=
case "${1:-}" in
  --version) echo "$version"; exit 0 ;;
  --spec) echo "llama-cpp-python==$release"; exit 0 ;;
  --fetch) fetch; exit 0 ;;
  --regenerate) regenerate "${2:?--regenerate needs the tree --tree made}"; exit 0 ;;
  "") fail "usage: llama-cpp-source.sh --version | --spec | --fetch | --regenerate SRC | [--tree] [--sdist FILE] DIR" ;;
esac
mode=build
if [ "$1" = --tree ]; then mode=tree; shift; fi
if [ "${1:-}" = --sdist ]; then sdist=${2:?--sdist needs a file}; shift 2; fi
dest=${1:?usage: llama-cpp-source.sh [--tree] [--sdist FILE] DIR}
src=$(unpack "$sdist" "$dest")
submodule_link="$src/vendor/llama.cpp/.git"
if [ "$mode" = tree ]; then
  rm -rf "$src/.git" "$submodule_link"
else
  git_dir=$(mktemp -d "$dest/.arbor-series.XXXXXX")
  [ ! -e "$submodule_link" ] || mv "$submodule_link" "$git_dir.submodule-link"
fi
commit_release "$src" "$mode"
copy_native "$src"
if [ "$mode" = tree ]; then
  git_in "$src" add -f -A vendor/llama.cpp
  git_in "$src" commit -q --allow-empty -m "arbor: native sources (native/, copied; not a topic)"
  git_in "$src" tag arbor-native
fi
apply_topics "$src" "$mode"
if [ "$mode" = build ]; then
  [ ! -e "$git_dir.submodule-link" ] || mv "$git_dir.submodule-link" "$submodule_link"
  rm -rf "$git_dir"
  grep -q "^__version__ = \"$release\"" "$src/llama_cpp/__init__.py" || fail "llama_cpp/__init__.py does not say version $release"
  sed -i "s/^__version__ = \"$release\"/__version__ = \"$version\"/" "$src/llama_cpp/__init__.py"
fi
echo "$src"
