"""A turn's events as a LangGraph run's stream.

The workbench streams a turn as its own events (app/services/turn_log.py: token, model_call,
tool_call, tool_result, approval_request, final, ...), live from the process running it or
from its journal in the database. `RunStream` turns them into the stream modes a LangGraph
client asks for, so the same turn, followed from any workbench process, reads the same:

    values          the state after each step: at the start (the input added), after the model
                    node, after the tools node, with "__interrupt__" at an approval, and at the
                    end the state of the turn's last checkpoint
    updates         {"model": {"messages": [ai]}}, {"tools": {"messages": [...]}},
                    {"__interrupt__": [...]}
    messages-tuple  ("messages") [message chunk, metadata] per streamed token
    messages        messages/metadata, messages/partial (the message so far), messages/complete
    events          on_chain_start, on_chat_model_stream, on_chat_model_end, on_tool_end, on_chain_end
    custom          the workbench's own events as they are (cache source, reused tokens, drafted
                    tokens, spans: what the session page shows)

Other modes (debug, tasks, checkpoints, tools, lifecycle) have nothing here and send nothing.
Messages between the start and the end are built from the events (an AI message's id is
`run-<turn>-<n>`); the last `values` is read from the checkpoint, with the graph's own ids.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, ToolMessage
from langchain_core.messages.tool import invalid_tool_call, tool_call

from app.db.models import Approval
from app.platform.wire import approval_interrupt, jsonable

SUPPORTED_MODES = ("values", "updates", "messages", "messages-tuple", "events", "custom")
TERMINAL = ("final", "error", "cancelled", "approval_request")

Emit = tuple[str, Any]


class RunStream:
    """One run's stream: feed it the turn's events (`events`), read (event, data) pairs."""

    def __init__(self, modes: list[str], *, run_id: str, thread_id: str, graph_id: str,
                 start_values: Callable[[dict], Awaitable[dict]],
                 end_values: Callable[[dict], Awaitable[dict | None]]) -> None:
        self.modes = set(modes)
        self.run_id, self.thread_id, self.graph_id = run_id, thread_id, graph_id
        self._start_values, self._end_values = start_values, end_values
        self.values: dict[str, Any] = {"messages": []}
        self.messages: list[BaseMessage] = []
        self.ai: AIMessage | None = None  # the model step waiting for its tool calls
        self.tool_results: list[ToolMessage] = []
        self.expected_results = 0
        self.text = ""  # the current model step's text so far
        self.step = 0
        self.count = 0  # model steps seen: message ids
        self.streamed_id: str | None = None
        self.outcome: dict | None = None  # the terminal event

    def _meta(self, node: str) -> dict:
        return {"run_id": self.run_id, "thread_id": self.thread_id, "graph_id": self.graph_id,
                "langgraph_node": node, "langgraph_step": self.step, "langgraph_checkpoint_ns": "",
                "langgraph_triggers": [f"branch:to:{node}"]}

    async def events(self, source: AsyncIterator[dict]) -> AsyncIterator[Emit]:
        yield "metadata", {"run_id": self.run_id, "thread_id": self.thread_id, "attempt": 1}
        async for event in source:
            for item in await self._on(event):
                yield item
            if event.get("type") in TERMINAL:
                self.outcome = event
                return

    # -- one workbench event -------------------------------------------------------------------
    async def _on(self, event: dict) -> list[Emit]:
        kind = event.get("type")
        out: list[Emit] = []
        if kind not in ("tool_call",) and self.ai is not None:
            out += self._model_done()
        if kind not in ("tool_result", "tool_call") and self.tool_results:
            out += self._tools_done()
        if "custom" in self.modes:
            out.append(("custom", event))
        if kind == "turn":
            out += await self._start(event)
        elif kind == "token":
            out += self._token(str(event.get("text") or ""))
        elif kind == "model_call":
            self._model_call(event)
        elif kind == "tool_call" and self.ai is not None:
            self._tool_call(event)
        elif kind == "tool_result":
            out += self._tool_result(event)
        elif kind == "approval_request":
            out += self._interrupt(event)
        elif kind == "final":
            out += await self._final(event)
        elif kind in ("error", "cancelled"):
            out.append(("error", {"error": event.get("error_type") or kind, "message": event.get("message") or kind}))
        return out

    async def _start(self, event: dict) -> list[Emit]:
        self.values = await self._start_values(event)
        self.messages = list(self.values.get("messages") or [])
        out: list[Emit | None] = [self._values()]
        if "events" in self.modes:
            out.append(("events", self._lc_event("on_chain_start", "LangGraph", {"input": jsonable(self.values)},
                                                 self.run_id)))
        return [o for o in out if o is not None]

    def _token(self, text: str) -> list[Emit]:
        if not text:
            return []
        out: list[Emit] = []
        if self.streamed_id is None:
            self.count += 1
            self.step += 1
            self.streamed_id = f"run-{self.run_id}-{self.count}"
            if "messages" in self.modes:
                out.append(("messages/metadata", {self.streamed_id: {"metadata": self._meta("model")}}))
        self.text += text
        chunk = AIMessageChunk(content=text, id=self.streamed_id)
        if "messages-tuple" in self.modes:
            out.append(("messages", [jsonable(chunk), self._meta("model")]))
        if "messages" in self.modes:
            out.append(("messages/partial", [jsonable(AIMessageChunk(content=self.text, id=self.streamed_id))]))
        if "events" in self.modes:
            out.append(("events", self._lc_event("on_chat_model_stream", "ArborChatModel", {"chunk": jsonable(chunk)},
                                                 self.streamed_id)))
        return out

    def _model_call(self, event: dict) -> None:
        if self.streamed_id is None:  # a step that streamed no text (tool calls only)
            self.count += 1
            self.step += 1
            self.streamed_id = f"run-{self.run_id}-{self.count}"
        usage = None
        if event.get("prompt_tokens") is not None and event.get("completion_tokens") is not None:
            usage = {"input_tokens": event["prompt_tokens"], "output_tokens": event["completion_tokens"],
                     "total_tokens": event["prompt_tokens"] + event["completion_tokens"],
                     "input_token_details": {"cache_read": event.get("cached_tokens") or 0}}
        self.ai = AIMessage(content=self.text, id=self.streamed_id, usage_metadata=usage, response_metadata={
            "finish_reason": event.get("finish_reason"),
            "arbor": {k: event.get(k) for k in ("cached_tokens", "cache_source", "ttft_ms", "draft_n",
                                                "draft_n_accepted", "duration_ms", "span_id")}})
        self.text, self.streamed_id = "", None

    def _tool_call(self, event: dict) -> None:
        assert self.ai is not None
        raw = event.get("arguments") or "{}"
        try:
            args = json.loads(raw)
            if not isinstance(args, dict):
                raise ValueError("not an object")
            self.ai.tool_calls.append(tool_call(name=event.get("name") or "", args=args, id=event.get("tool_call_id")))
        except ValueError as exc:
            self.ai.invalid_tool_calls.append(invalid_tool_call(name=event.get("name"), args=raw,
                                                                id=event.get("tool_call_id"), error=str(exc)))

    def _model_done(self) -> list[Emit]:
        ai, self.ai = self.ai, None
        assert ai is not None
        self.messages.append(ai)
        self.expected_results = len(ai.tool_calls) + len(ai.invalid_tool_calls)
        dumped = jsonable(ai)
        out: list[Emit | None] = [self._update("model", {"messages": [dumped]}), self._values()]
        if "messages" in self.modes:
            out.append(("messages/complete", [dumped]))
        if "events" in self.modes:
            out.append(("events", self._lc_event("on_chat_model_end", "ArborChatModel", {"output": dumped},
                                                 str(ai.id))))
        return [o for o in out if o is not None]

    def _tool_result(self, event: dict) -> list[Emit]:
        message = ToolMessage(content=str(event.get("content") or ""), tool_call_id=str(event.get("tool_call_id")),
                              name=event.get("name"), status="error" if event.get("error") else "success")
        self.tool_results.append(message)
        out: list[Emit] = []
        if "events" in self.modes:
            out.append(("events", self._lc_event("on_tool_end", str(event.get("name")), {"output": jsonable(message)},
                                                 str(event.get("tool_call_id")))))
        if len(self.tool_results) >= self.expected_results:
            out += self._tools_done()
        return out

    def _tools_done(self) -> list[Emit]:
        results, self.tool_results = self.tool_results, []
        self.step += 1
        self.messages.extend(results)
        out = [self._update("tools", {"messages": [jsonable(m) for m in results]}), self._values()]
        return [o for o in out if o is not None]

    def _interrupt(self, event: dict) -> list[Emit]:
        approval = Approval(id=event["approval_id"], session_id="", branch_id=self.thread_id, turn_id=event["turn_id"],
                            run_id=self.run_id, tool_call_id=event["tool_call_id"], tool_name=event["tool_name"],
                            arguments=event.get("arguments"))
        interrupt = approval_interrupt(approval)
        out: list[Emit | None] = [self._update("__interrupt__", [interrupt], raw=True)]
        if "values" in self.modes:
            out.append(("values", {**self._current(), "__interrupt__": [interrupt]}))
        return [o for o in out if o is not None]

    async def _final(self, event: dict) -> list[Emit]:
        values = await self._end_values(event)
        out: list[Emit] = []
        if values is not None and "values" in self.modes:
            out.append(("values", values))
        if "events" in self.modes:
            out.append(("events", self._lc_event("on_chain_end", "LangGraph", {"output": values or self._current()},
                                                 self.run_id)))
        return out

    # -- helpers -------------------------------------------------------------------------------
    def _current(self) -> dict:
        return {**jsonable(self.values), "messages": [jsonable(m) for m in self.messages]}

    def _values(self) -> Emit | None:
        return ("values", self._current()) if "values" in self.modes else None

    def _update(self, node: str, value: Any, raw: bool = False) -> Emit | None:
        if "updates" not in self.modes:
            return None
        return "updates", {node: value if raw else jsonable(value)}

    def _lc_event(self, name: str, who: str, data: dict, run_id: str) -> dict:
        return {"event": name, "name": who, "run_id": run_id, "tags": [], "parent_ids": [self.run_id],
                "metadata": self._meta("model" if "chat_model" in name else "tools" if "tool" in name else ""),
                "data": data}
