"""No import circle among the cache's modules (issue 36): every import counts, also one under
TYPE_CHECKING or inside a function, since a circle there is still two modules that cannot be
read, changed or tested one without the other. Checked on the source (AST), as
tests/test_import_direction.py checks the layers."""

from __future__ import annotations

from pathlib import Path

from tests.test_import_direction import ROOT, imported_modules


def import_graph(package: Path, root: Path = ROOT) -> dict[str, set[str]]:
    """module -> the modules of `package` it imports (any import, anywhere in the file)."""
    modules = {".".join(p.relative_to(root).with_suffix("").parts): p for p in sorted(package.glob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found = set()
        for _, imported in imported_modules(path.read_text(encoding="utf-8"), name):
            if imported in modules and imported != name:
                found.add(imported)
        graph[name] = found
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_cache_modules_import_without_a_circle():
    graph = import_graph(ROOT / "server" / "cache")
    assert len(graph) > 10 and graph["server.cache.radix_tree"], "the check would prove nothing"
    assert circles(graph) == []


def test_the_check_finds_a_circle_through_type_checking_imports(tmp_path):
    pkg = tmp_path / "server" / "cache"
    pkg.mkdir(parents=True)
    (pkg / "tree.py").write_text("from server.cache.queue import Queue\n")
    (pkg / "queue.py").write_text("from typing import TYPE_CHECKING\n"
                                  "if TYPE_CHECKING:\n    from server.cache.policy import Policy\n")
    (pkg / "policy.py").write_text("def f():\n    from server.cache.tree import Tree\n")
    (pkg / "leaf.py").write_text("from server.cache.tree import Tree\n")
    graph = import_graph(pkg, tmp_path)
    assert circles(graph) == [["server.cache.policy", "server.cache.queue", "server.cache.tree"]]
