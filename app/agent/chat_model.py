"""The model adapter behind langchain-core's chat model interface.

`ArborChatModel` is a `BaseChatModel` over `ModelAdapter` (app/agent/model_client.py): the
request body is the adapter's (`build_body`, cache hints included), the answer streams
through the adapter, each text piece goes to the callbacks' `on_llm_new_token` (LangGraph's
"messages" stream mode and the workbench's `token` events both listen there), and the
result is one `AIMessage` made exactly as app/agent/messages.py reads an OpenAI message.

Why not ChatOpenAI: it rewrites tool-call arguments with ``json.dumps`` and adds fields to
tool messages (so a replayed history would no longer match the server's cached prefix), and
it drops the server's ``arbor`` extension (cache source, restore timings).

What the server reported travels with the message: ``usage_metadata`` (with
``input_token_details.cache_read``), ``response_metadata["finish_reason"|"model_name"]``
and ``response_metadata["arbor"]``: the adapter's counts, ``cache``, ``timings``, ``ttft_ms``
and ``duration_ms``. `call_result` rebuilds the adapter's `ModelCallResult` from it for the
trace.

Call options (keyword arguments of ``ainvoke``, or ``bind``): ``tools`` (OpenAI tool
entries; `bind_tools` converts LangChain tools), ``tool_choice``, ``max_tokens``,
``cache_session`` (the cache hint's session key; without one no hint is sent); or ``body``:
a request body built already (the agent graph builds, fits and records each step's body:
app/agent/requests.py), sent exactly as it is; the messages are then only what the
callbacks see.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields
from typing import Any, cast

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.messages.ai import LC_ID_PREFIX, UsageMetadata
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import ConfigDict

from app.agent.messages import from_openai, openai_tool_calls, to_openai
from app.agent.model_client import ModelAdapter, ModelCallResult
from app.telemetry import otlp

_REPORTED = [f.name for f in fields(ModelCallResult) if f.name not in ("content", "tool_calls", "model",
                                                                       "finish_reason")]


class ArborChatModel(BaseChatModel):
    """Chat completions from any OpenAI-compatible server, streamed, with arbor's cache extension."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    adapter: ModelAdapter

    @property
    def _llm_type(self) -> str:
        return "arbor-openai-compatible"

    def bind_tools(self, tools: Sequence[Any], *, tool_choice: Any = None, **kwargs: Any) -> Runnable:
        """Bind LangChain tools (or OpenAI tool entries) for the calls of the returned runnable."""
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], tool_choice=tool_choice, **kwargs)

    async def request_body(self, messages: Sequence[BaseMessage], *, tools: list[dict] | None = None,
                           tool_choice: Any = None, max_tokens: int | None = None,
                           cache_session: str | None = None) -> dict:
        """The exact body a call with these messages and options sends."""
        model = await self.adapter.model_name()
        return self.adapter.build_body(model, to_openai(messages), tools or [], tool_choice, cache_session,
                                       max_tokens)

    async def _agenerate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                         run_manager: AsyncCallbackManagerForLLMRun | None = None, body: dict | None = None,
                         **kwargs: Any) -> ChatResult:
        if stop:
            raise ValueError("ArborChatModel does not support stop sequences")
        if body is None:
            body = await self.request_body(messages, **kwargs)
        # The chunks and the message share an id: LangGraph's "messages" stream then knows the
        # final message is the one it already streamed.
        message_id = f"{LC_ID_PREFIX}{run_manager.run_id}" if run_manager is not None else None

        async def on_token(text: str) -> None:
            if run_manager is not None:
                chunk = ChatGenerationChunk(message=AIMessageChunk(content=text, id=message_id))
                await run_manager.on_llm_new_token(text, chunk=chunk)

        result = await self.adapter.stream(body, on_token=on_token, traceparent=_traceparent(run_manager))
        message = ai_message(result)
        message.id = message_id
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> ChatResult:
        # The adapter is an async client; the workbench only ever awaits the model.
        raise NotImplementedError("ArborChatModel is async: use ainvoke")


def _traceparent(run_manager: AsyncCallbackManagerForLLMRun | None) -> str | None:
    """The request's trace context while the workbench exports spans (app/telemetry/otlp.py): a
    new span of the trace of the turn named in the graph's config metadata."""
    telemetry = otlp.active()
    turn_id = (run_manager.metadata or {}).get("turn_id") if run_manager is not None else None
    return telemetry.model_traceparent(turn_id) if telemetry is not None and turn_id else None


def ai_message(result: ModelCallResult) -> AIMessage:
    """The adapter's result as an AIMessage carrying what the server reported."""
    message = from_openai([result.assistant_message()])[0]
    assert isinstance(message, AIMessage)  # an assistant message
    message.response_metadata = {"finish_reason": result.finish_reason, "model_name": result.model,
                                 "arbor": {name: getattr(result, name) for name in _REPORTED}}
    if result.prompt_tokens is not None and result.completion_tokens is not None:
        usage = UsageMetadata(input_tokens=result.prompt_tokens, output_tokens=result.completion_tokens,
                              total_tokens=result.prompt_tokens + result.completion_tokens)
        if result.cached_tokens is not None:
            usage["input_token_details"] = {"cache_read": result.cached_tokens}
        message.usage_metadata = usage
    return message


def call_result(message: AIMessage) -> ModelCallResult:
    """The `ModelCallResult` an ArborChatModel message was made from (for the trace)."""
    meta = message.response_metadata
    # its content is the text the adapter returned (a str, never content blocks); its calls as the
    # model wrote them (openai_tool_calls writes an invalid call's arguments as the history sends them)
    calls = message.additional_kwargs.get("tool_calls") or openai_tool_calls(message)
    return ModelCallResult(content=cast(str, message.content), tool_calls=list(calls),
                           finish_reason=meta.get("finish_reason"), model=meta.get("model_name"),
                           **meta.get("arbor", {}))
