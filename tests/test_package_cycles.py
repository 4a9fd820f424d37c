"""No import circle between the project's packages, bench/ included, nor between the harness's
sub-packages: every import counts, also one inside a function, as in tests/test_import_direction.py
(which says who may import whom; this says that, whatever is allowed, no two packages need each
other). tests/ is left out: the suite imports every package, and a few benchmarks borrow its
fixtures (bench/turn_follow.py, session_page_load.py, cache_micro.py), so it sits beside bench/ on top."""

from __future__ import annotations

from pathlib import Path

from tests.server.cache.test_import_cycles import circles
from tests.test_import_direction import ROOT, imported_modules

#: the packages whose imports of each other must form no circle
TOP_PACKAGES = ("app", "bench", "frontend", "harness", "scenarios", "server", "tools")


def unit_of(module: str, units: tuple[str, ...]) -> str | None:
    """The unit (a package, or a sub-package or module of one) that `module` belongs to, if any."""
    return next((u for u in units if module == u or module.startswith(u + ".")), None)


def unit_graph(units: tuple[str, ...], root: Path = ROOT) -> dict[str, set[str]]:
    """unit -> the other units its modules import; a unit is a dotted package or module name under `root`."""
    graph: dict[str, set[str]] = {}
    for unit in units:
        base = root.joinpath(*unit.split("."))
        paths = sorted(base.rglob("*.py")) if base.is_dir() else [base.with_suffix(".py")]
        found: set[str] = set()
        for path in paths:
            module = ".".join(path.relative_to(root).with_suffix("").parts)
            for _, name in imported_modules(path.read_text(encoding="utf-8"), module):
                other = unit_of(name, units)
                if other is not None and other != unit:
                    found.add(other)
        graph[unit] = found
    return graph


def harness_units(root: Path = ROOT) -> tuple[str, ...]:
    """The harness's sub-packages and top-level modules, as units."""
    base = root / "harness"
    return tuple(sorted(f"harness.{p.name}" for p in base.iterdir() if p.is_dir() and (p / "__init__.py").exists())
                 + sorted(f"harness.{p.stem}" for p in base.glob("*.py") if p.stem != "__init__"))


def test_the_packages_import_without_a_circle():
    graph = unit_graph(TOP_PACKAGES)
    assert graph["bench"] >= {"harness", "server", "app"} and "harness" in graph["app"], \
        "the check would prove nothing"
    assert circles(graph) == []


def test_the_harness_sub_packages_import_without_a_circle():
    units = harness_units()
    assert {"harness.models", "harness.kernels", "harness.serving", "harness.workloads", "harness.reports",
            "harness.manifest"} <= set(units)
    graph = unit_graph(units)
    assert graph["harness.serving"] >= {"harness.workloads", "harness.reports"}, "the check would prove nothing"
    assert circles(graph) == []


def test_the_check_finds_a_circle_through_a_function_level_import(tmp_path):
    for package in ("alpha", "beta", "gamma"):
        (tmp_path / package).mkdir()
    (tmp_path / "alpha" / "a.py").write_text("from beta.b import thing\n")
    (tmp_path / "beta" / "b.py").write_text("def later():\n    import gamma.c\n")
    (tmp_path / "gamma" / "c.py").write_text("import alpha.a as a\n")
    (tmp_path / "gamma" / "d.py").write_text("import json\n")
    graph = unit_graph(("alpha", "beta", "gamma"), tmp_path)
    assert graph == {"alpha": {"beta"}, "beta": {"gamma"}, "gamma": {"alpha"}}
    assert circles(graph) == [["alpha", "beta", "gamma"]]
