"""Imports go one way (docs/architecture.md, "The house"): scenarios use tools, never the reverse; the app
serves the frontend, which never imports the app; the workbench talks to the server only over
HTTP; the server stands alone; the benchmark harness (harness/) stands alone too, so the workbench's
replay and the benchmarks' entry points (bench/) can both use it, and nothing but bench/ and the
tests imports bench/. Checked on the source (AST), so an import inside a function, a relative
import or an importlib call with a literal name is caught too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("app", "frontend", "harness", "scenarios", "server", "tools")

#: package -> the project packages it must not import
FORBIDDEN: dict[str, frozenset[str]] = {
    "tools": frozenset({"scenarios", "app", "frontend", "server", "harness", "bench", "tests"}),
    "scenarios": frozenset({"app", "frontend", "server", "harness", "bench", "tests"}),
    "frontend": frozenset({"app", "scenarios", "tools", "server", "harness", "bench", "tests"}),
    "app": frozenset({"server", "bench", "tests"}),
    "server": frozenset({"app", "frontend", "scenarios", "tools", "harness", "bench", "tests"}),
    # talks to servers over HTTP and to llama.cpp's libraries through ctypes: none of the project
    "harness": frozenset({"app", "server", "frontend", "scenarios", "tools", "bench", "tests"}),
}


def imported_modules(source: str, module: str) -> list[tuple[int, str]]:
    """(line, dotted name) of every module `source` imports; `module` is its own dotted name
    (for relative imports)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[: -node.level]
                found.append((node.lineno, ".".join([*base, node.module] if node.module else base)))
            else:
                found.append((node.lineno, node.module or ""))
        elif isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if name in ("import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant) \
                    and isinstance(node.args[0].value, str):
                found.append((node.lineno, node.args[0].value))
    return found


def violations(package: str, root: Path = ROOT) -> list[str]:
    """"path:line imports name" for each forbidden import in `package`."""
    out = []
    for path in sorted((root / package).rglob("*.py")):
        module = ".".join(path.relative_to(root).with_suffix("").parts)
        for line, name in imported_modules(path.read_text(encoding="utf-8"), module):
            if name.split(".")[0] in FORBIDDEN[package]:
                out.append(f"{path.relative_to(root)}:{line} imports {name}")
    return out


@pytest.mark.parametrize("package", PACKAGES)
def test_imports_go_one_way(package):
    assert list((ROOT / package).rglob("*.py")), f"{package}/ has no modules: the check would prove nothing"
    assert violations(package) == []


def test_the_check_catches_every_kind_of_import(tmp_path):
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "bad.py").write_text(
        "import json\n"
        "from scenarios.field_maintenance.fleet import load_fleet\n"
        "def later():\n"
        "    import app.settings\n"
        "    return importlib.import_module('frontend.pages')\n"
        "from . import base\n", encoding="utf-8")
    assert violations("tools", tmp_path) == [
        "tools/bad.py:2 imports scenarios.field_maintenance.fleet",
        "tools/bad.py:4 imports app.settings",
        "tools/bad.py:5 imports frontend.pages",
    ]
    (tmp_path / "frontend").mkdir()
    (tmp_path / "frontend" / "pages.py").write_text("from ..app import main\n", encoding="utf-8")
    assert violations("frontend", tmp_path) == ["frontend/pages.py:1 imports app"]


#: inside the server: the engine knows tokens, the cache knows sequences and segments, the
#: API translates HTTP; the composition root (bootstrap) builds the first two, never the API.
SERVER_LAYERS: dict[str, tuple[str, ...]] = {
    "server/engine": ("server.cache", "server.api", "server.bootstrap"),
    "server/cache": ("server.api", "server.bootstrap"),
    "server/bootstrap.py": ("server.api",),
}


def server_layer_violations(root: Path = ROOT) -> list[str]:
    out = []
    for where, forbidden in SERVER_LAYERS.items():
        target = root / where
        for path in sorted(target.rglob("*.py") if target.is_dir() else [target]):
            module = ".".join(path.relative_to(root).with_suffix("").parts)
            for line, name in imported_modules(path.read_text(encoding="utf-8"), module):
                if any(name == f or name.startswith(f + ".") for f in forbidden):
                    out.append(f"{path.relative_to(root)}:{line} imports {name}")
    return out


def test_server_layers_import_downwards_only(tmp_path):
    assert server_layer_violations() == []
    (tmp_path / "server" / "engine").mkdir(parents=True)
    (tmp_path / "server" / "cache").mkdir()
    (tmp_path / "server" / "engine" / "bad.py").write_text("from server.cache.router import CacheRouter\n")
    (tmp_path / "server" / "bootstrap.py").write_text("from server.api import responses\n")
    assert server_layer_violations(tmp_path) == ["server/engine/bad.py:1 imports server.cache.router",
                                                 "server/bootstrap.py:1 imports server.api"]
