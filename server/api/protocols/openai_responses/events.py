"""The server-sent events of one streamed response, as the `openai` client's parser reads them.

`response.created` and `response.in_progress` open the stream. The reply parser's deltas
(server.api.engine_bridge.reply_stream) open, fill and close output items in the order they come:

- reasoning: `response.output_item.added`, `response.content_part.added` (reasoning_text),
  `response.reasoning_text.delta`..., `.done`, `response.content_part.done`,
  `response.output_item.done`;
- content: the same with an `output_text` part and `response.output_text.delta` / `.done`;
- a tool call: `response.output_item.added` (a function_call with its call_id and name, once the
  parser knows the name), `response.function_call_arguments.delta`..., `.done`,
  `response.output_item.done`.

An item is closed when an item of another kind (or another call) opens, or at the end; then
`response.completed` (or `response.incomplete` at max_output_tokens) carries the whole
Response, its output the items exactly as streamed (same ids), which is what the client's
accumulator checks. A call that max_output_tokens cut off (its arguments are no JSON object)
ends with status "incomplete" and is never replayed as a call (server.api.protocols.openai_responses.translate).
Every event has its `sequence_number`, from 0; each frame names its event type (`event:`) and
the stream ends without `[DONE]`, as OpenAI's does.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from server.api.engine_bridge.reply_stream import ContentDelta, Delta, ReasoningDelta, ReplyStream, ToolCallDelta
from server.api.http.errors import APIError
from server.api.protocols.openai_responses.output import (
    ResponseHead,
    TokenCounter,
    final_status,
    function_call_item,
    item_id,
    message_item,
    output_text,
    response_body,
)
from server.api.streaming.sse import sse_event
from server.engine.sequence import Finished, TextDelta


class ResponseEvents:
    """The stream driver's writer (server.api.streaming.driver) of one response."""

    def __init__(self, head: ResponseHead, reader: ReplyStream, count: TokenCounter,
                 on_finished: Callable[[dict[str, Any]], None] = lambda response: None):
        """`on_finished` gets the finished Response before its last event is written (the route
        stores it there, so a client may continue from it as soon as it reads the end)."""
        self._head = head
        self._reader = reader
        self._count = count
        self._on_finished = on_finished
        self._seq = 0
        self.output: list[dict[str, Any]] = []  # items as streamed, by output_index
        self._open: int | None = None  # output_index of the item being streamed
        self._calls: dict[int, int] = {}  # the reply's call index -> output_index

    def _event(self, kind: str, **fields: Any) -> str:
        data = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return sse_event(kind, data)

    def opening(self) -> str:
        body = response_body(self._head, "in_progress", [])
        return self._event("response.created", response=body) + self._event("response.in_progress", response=body)

    def delta(self, index: int, event: TextDelta) -> str:
        return self._frames(self._reader.feed(event.text))

    def finish(self, index: int, fin: Finished) -> str:
        """The last frames; the finished Response goes to `on_finished` first."""
        out = [self._frames(self._reader.finish())]
        complete = len(self._reader.calls)
        for call, index in self._calls.items():
            if call >= complete:  # cut off: dropped from the reply's calls
                self.output[index]["status"] = "incomplete"
        status = final_status(fin)
        if not self.output:  # an empty reply still has its message, as a whole answer does
            out.append(self._open_message())
        out.append(self._close(status))
        body = response_body(self._head, status, self.output, fin, self._count)
        out.append(self._event("response.completed" if status == "completed" else "response.incomplete",
                               response=body))
        self._on_finished(body)
        return "".join(out)

    def error(self, error: APIError) -> str:
        """`response.failed` for an engine error after the stream began (its status is 200 already)."""
        body = response_body(self._head, "failed", self.output,
                             error={"code": "server_error", "message": error.message})
        return self._event("response.failed", response=body)

    def end(self, fins: list[Finished] | None) -> str:
        return ""  # the stream ends without [DONE], as OpenAI's does

    def close(self) -> None:
        self._reader.close()

    def _frames(self, parts: list[Delta]) -> str:
        out: list[str] = []
        for p in parts:
            if isinstance(p, ReasoningDelta):
                out.append(self._text(p.text, "reasoning"))
            elif isinstance(p, ContentDelta):
                out.append(self._text(p.text, "message"))
            elif isinstance(p, ToolCallDelta) and p.name is not None:
                out.append(self._close("completed"))
                item = function_call_item(item_id("fc"), p.id or "", p.name, "", "in_progress")
                out.append(self._add(item))
                self._calls[p.index] = len(self.output) - 1
                if p.arguments:
                    out.append(self._arguments(len(self.output) - 1, p.arguments))
            elif isinstance(p, ToolCallDelta) and p.index in self._calls:
                out.append(self._arguments(self._calls[p.index], p.arguments))
        return "".join(out)

    def _add(self, item: dict[str, Any]) -> str:
        """Open `item` as the next output item."""
        self.output.append(item)
        self._open = len(self.output) - 1
        return self._event("response.output_item.added", output_index=self._open, item=copy.deepcopy(item))

    def _text(self, text: str, kind: str) -> str:
        """Reasoning or content text, into the open item of that kind (opened when another is)."""
        out = ""
        if self._open is None or self.output[self._open]["type"] != kind:
            out += self._close("completed")
            out += self._open_message() if kind == "message" else self._open_reasoning()
        assert self._open is not None
        index, item = self._open, self.output[self._open]
        item["content"][0]["text"] += text
        delta = "response.output_text.delta" if kind == "message" else "response.reasoning_text.delta"
        extra: dict[str, Any] = {"logprobs": []} if kind == "message" else {}
        return out + self._event(delta, item_id=item["id"], output_index=index, content_index=0, delta=text, **extra)

    def _open_message(self) -> str:
        out = self._add(message_item(item_id("msg"), None, "in_progress"))
        item = self.output[-1]
        item["content"].append(output_text(""))
        return out + self._event("response.content_part.added", item_id=item["id"], output_index=self._open,
                                 content_index=0, part=output_text(""))

    def _open_reasoning(self) -> str:
        part = {"type": "reasoning_text", "text": ""}
        item: dict[str, Any] = {"type": "reasoning", "id": item_id("rs"), "summary": [], "content": [dict(part)]}
        out = self._add({**item, "content": []})
        self.output[-1] = item  # announced without its part, which content_part.added brings
        return out + self._event("response.content_part.added", item_id=item["id"], output_index=self._open,
                                 content_index=0, part=part)

    def _arguments(self, index: int, delta: str) -> str:
        item = self.output[index]
        item["arguments"] += delta
        return self._event("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                           delta=delta)

    def _close(self, status: str) -> str:
        """Close the open item, if any: its `.done` events with the whole text or arguments."""
        if self._open is None:
            return ""
        index, item = self._open, self.output[self._open]
        self._open = None
        out = ""
        if item["type"] == "function_call":
            if item["status"] == "in_progress":
                item["status"] = "completed"
            out += self._event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                               name=item["name"], arguments=item["arguments"])
        else:
            part = item["content"][0]
            if item["type"] == "message":
                item["status"] = status
                out += self._event("response.output_text.done", item_id=item["id"], output_index=index,
                                   content_index=0, text=part["text"], logprobs=[])
            else:
                out += self._event("response.reasoning_text.done", item_id=item["id"], output_index=index,
                                   content_index=0, text=part["text"])
            out += self._event("response.content_part.done", item_id=item["id"], output_index=index,
                               content_index=0, part=copy.deepcopy(part))
        return out + self._event("response.output_item.done", output_index=index, item=copy.deepcopy(item))
