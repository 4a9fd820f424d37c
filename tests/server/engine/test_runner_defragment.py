"""LlamaRunner asks the runtime to defragment paged attention's pages when the KV has room again: after a
reclaim that freed cells, and when the engine goes idle (simulated runtime and prefix provider; the move itself
is tested on the real engine in test_page_ownership.py)."""

from server.engine.runner import LlamaRunner


class Runtime:
    def __init__(self):
        self.defragmented = 0

    def defragment_pages(self) -> int:
        self.defragmented += 1
        return 0


class Prefix:
    def __init__(self, frees: bool):
        self.frees = frees
        self.background_calls: list[bool] = []

    def reclaim(self, slots) -> bool:
        return self.frees

    def background(self, idle: bool) -> None:
        self.background_calls.append(idle)


def test_a_reclaim_that_freed_cells_and_an_idle_engine_defragment():
    runtime, prefix = Runtime(), Prefix(frees=True)
    runner = LlamaRunner(runtime, prefix)
    assert runner.reclaim(slots=None) is True
    assert runtime.defragmented == 1
    runner.background(idle=False)
    assert runtime.defragmented == 1
    runner.background(idle=True)
    assert runtime.defragmented == 2
    assert prefix.background_calls == [False, True]


def test_a_reclaim_that_freed_nothing_moves_nothing():
    runtime = Runtime()
    runner = LlamaRunner(runtime, Prefix(frees=False))
    assert runner.reclaim(slots=None) is False
    assert runtime.defragmented == 0
