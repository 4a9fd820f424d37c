"""server/api's packages import downwards only (server/api/__init__.py): app -> routes ->
protocols -> streaming -> engine_bridge -> http, a layer free to skip those below it, and no two of
them import each other. Every import counts, also one inside a function (tests/test_package_cycles.py)."""

from __future__ import annotations

from tests.server.cache.test_import_cycles import circles
from tests.test_package_cycles import unit_graph

LAYERS = ("server.api.app", "server.api.routes", "server.api.protocols", "server.api.streaming",
          "server.api.engine_bridge", "server.api.http")


def test_the_api_packages_import_downwards_only():
    graph = unit_graph(LAYERS)
    assert graph["server.api.routes"] >= {"server.api.protocols", "server.api.streaming"}, \
        "the check would prove nothing"
    assert circles(graph) == []
    upward = {(a, b) for a, deps in graph.items() for b in deps if LAYERS.index(b) < LAYERS.index(a)}
    assert upward == set()
