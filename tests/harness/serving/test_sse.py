"""harness/serving/sse.py: the data of `data:` lines, nothing from other lines, [DONE] left out of
the JSON chunks, and lines split across the chunks a proxy passes on."""

from __future__ import annotations

import asyncio
import json

import pytest

from harness.serving import sse

STREAM = [
    "event: response.output_text.delta",
    'data: {"type": "response.output_text.delta", "delta": "Hi"}',
    "",
    ": keep-alive comment",
    'data:{"choices": [{"delta": {"content": "there"}}]}',
    "id: 7",
    "data: [DONE]",
]


def test_a_data_line_carries_its_text_and_other_lines_carry_nothing():
    assert sse.data_of('data: {"a": 1}') == '{"a": 1}'
    assert sse.data_of('data:{"a": 1}  ') == '{"a": 1}'
    assert sse.data_of("data: [DONE]") == sse.DONE
    assert sse.data_of("data:") == ""
    for line in ("", "event: message_start", ": ping", "id: 3", "retry: 100", " data: x"):
        assert sse.data_of(line) is None


def test_json_chunks_read_every_data_line_but_done():
    assert list(sse.json_chunks(STREAM)) == [{"type": "response.output_text.delta", "delta": "Hi"},
                                             {"choices": [{"delta": {"content": "there"}}]}]


def test_the_async_reader_gives_the_same_chunks():
    async def lines():
        for line in STREAM:
            yield line

    async def read():
        return [chunk async for chunk in sse.ajson_chunks(lines())]

    assert asyncio.run(read()) == list(sse.json_chunks(STREAM))


def test_a_data_line_that_is_not_json_raises():
    with pytest.raises(json.JSONDecodeError):
        list(sse.json_chunks(["data: {not json"]))


def test_data_lines_wait_for_the_end_of_a_line_split_across_chunks():
    reader = sse.DataLines()
    assert reader.feed(b'event: x\ndata: {"a"') == []
    assert reader.feed(b': 1}\r\n\ndata: [DO') == ['{"a": 1}']
    assert reader.feed(b"NE]\n") == [sse.DONE]
    assert reader.feed(b"data: \xff\xfe\n: comment\ndata: 2\n") == ["2"]
