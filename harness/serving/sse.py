"""The one reader of Server-Sent Events that the harness, the benchmarks and the workbench's
replay use on a server's streamed answers (Chat Completions, Completions, Responses, Messages).

Contract, per line of the stream (a line as httpx's ``iter_lines`` gives it, without its end):

- a line that starts with ``data:`` carries the text after it, stripped of surrounding
  whitespace (``data: {...}`` and ``data:{...}`` carry the same);
- any other line carries nothing here: ``event:`` (Responses and Messages name the event again in
  the JSON's ``type``), ``id:``, ``retry:``, comments (``: ping``) and the blank line between events;
- :data:`DONE` (``[DONE]``) is Chat Completions' and Completions' last data line: no JSON.

Each OpenAI-compatible server this harness measures (arbor-server, llama-server, vLLM, SGLang)
sends one JSON object per ``data:`` line, so the data of one line is one whole chunk.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator
from typing import Any

#: the data of the last line of a Chat Completions or Completions stream
DONE = "[DONE]"

_DATA = "data:"


def data_of(line: str) -> str | None:
    """The data a line carries (see the module's docstring), or None for a line that carries none."""
    if not line.startswith(_DATA):
        return None
    return line[len(_DATA):].strip()


def json_chunks(lines: Iterable[str]) -> Iterator[Any]:
    """The JSON value of every data line of ``lines`` but :data:`DONE`, in order. Reads ``lines``
    to its end (so a streamed response is read whole). A data line that is not JSON raises
    ``json.JSONDecodeError``."""
    for line in lines:
        data = data_of(line)
        if data is not None and data != DONE:
            yield json.loads(data)


async def ajson_chunks(lines: AsyncIterable[str]) -> AsyncIterator[Any]:
    """:func:`json_chunks` of an async stream of lines (httpx's ``aiter_lines``)."""
    async for line in lines:
        data = data_of(line)
        if data is not None and data != DONE:
            yield json.loads(data)


class DataLines:
    """The data of a byte stream's lines as its chunks arrive, for a reader that passes the bytes
    on unchanged (a recording proxy): a line is read once its end (``\\n``) has arrived; bytes
    after the last end wait for the next chunk. A line that is not UTF-8 carries nothing."""

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, chunk: bytes) -> list[str]:
        """The data of every line that ``chunk`` completes, in order (see :func:`data_of`; the
        line is stripped of surrounding whitespace first)."""
        self._pending += chunk
        *lines, self._pending = self._pending.split(b"\n")
        found = []
        for raw in lines:
            try:
                line = raw.strip().decode("utf-8")
            except UnicodeDecodeError:
                continue
            data = data_of(line)
            if data is not None:
                found.append(data)
        return found
