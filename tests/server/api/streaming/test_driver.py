"""The stream driver with a recording writer and scripted choices (no model): what it writes,
in what order, in how many writes, and that the writer is closed however the stream ends."""

from __future__ import annotations

import asyncio

from server.api.http.errors import APIError
from server.api.streaming.driver import stream_frames, whole_answer
from server.engine.sequence import CacheReport, Finished, TextDelta


def fin(reason: str = "stop", **kw) -> Finished:
    return Finished(reason, 5, 0, 2, 1.0, 1.0, CacheReport(), **kw)


class ScriptedChoices:
    """What the driver reads of `Choices`: `generations` (one per choice) and `events()`."""

    def __init__(self, n: int, script: list[tuple[int, TextDelta | Finished]], collected=None):
        self.generations = [object()] * n
        self._script = script
        self._collected = collected

    async def events(self):
        for item in self._script:
            yield item

    async def collect(self, watch):
        return self._collected


class RecordingWriter:
    def __init__(self, opening: str = "<open>"):
        self._opening = opening
        self.closed = False
        self.ends: list = []

    def opening(self) -> str:
        return self._opening

    def delta(self, index: int, event: TextDelta) -> str:
        return f"<{index}:{event.text}>" if event.text else ""  # "": text the parser holds back

    def finish(self, index: int, fin: Finished) -> str:
        return f"<{index}:{fin.finish_reason}>"

    def error(self, error: APIError) -> str:
        return f"<error {error.status}>"

    def end(self, fins: list[Finished] | None) -> str:
        self.ends.append(fins)
        return "<end>" if fins is not None else "<end after error>"

    def close(self) -> None:
        self.closed = True


async def frames_of(choices, writer) -> list[str]:
    return [f async for f in stream_frames(choices, lambda: writer)]


async def test_each_wake_up_is_one_write_and_the_last_finish_carries_the_end():
    first, second = fin(), fin("length")
    choices = ScriptedChoices(2, [(0, TextDelta("a", (1,))), (1, TextDelta("", (2,))), (1, TextDelta("b", (3,))),
                                  (0, first), (1, second)])
    writer = RecordingWriter()
    assert await frames_of(choices, writer) == ["<open>", "<0:a>", "<1:b>", "<0:stop>", "<1:length><end>"]
    assert writer.ends == [[first, second]] and writer.closed


async def test_an_engine_error_writes_the_error_then_the_end():
    choices = ScriptedChoices(2, [(0, TextDelta("a", (1,))), (1, fin("error", error="kv full", retryable=True)),
                                  (0, fin())])
    writer = RecordingWriter(opening="")
    assert await frames_of(choices, writer) == ["<0:a>", "<error 503>", "<end after error>"]
    assert writer.ends == [None] and writer.closed


async def test_a_client_that_leaves_mid_stream_still_closes_the_writer():
    choices = ScriptedChoices(1, [(0, TextDelta("a", (1,))), (0, TextDelta("b", (2,))), (0, fin())])
    writer = RecordingWriter()
    stream = stream_frames(choices, lambda: writer)
    assert await anext(stream) == "<open>"
    assert await anext(stream) == "<0:a>"
    await stream.aclose()  # what Starlette's cancellation of the response amounts to
    assert writer.closed and writer.ends == []


class _Request:
    """A request whose client stays: its next ASGI message never comes."""

    async def receive(self):
        await asyncio.Event().wait()


async def test_whole_answer_formats_every_choice_or_answers_499_for_a_client_gone():
    got = ["whole"]
    assert await whole_answer(ScriptedChoices(1, [], collected=got), _Request(), lambda g: {"got": g}) == {"got": got}
    gone = await whole_answer(ScriptedChoices(1, [], collected=None), _Request(), lambda g: {"got": g})
    assert gone.status_code == 499
