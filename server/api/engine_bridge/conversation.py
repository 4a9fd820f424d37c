"""From chat messages to a chat plan: message-order checks, assistant prefill, and the request
handed to llama.cpp's chat layer (server.api.engine_bridge.chat_layer), which renders it with the model's
template and says how to constrain and parse the reply.

Prefill (llama-server's behaviour; vLLM's `continue_final_message`): a conversation that
ends in an assistant message is continued, not answered. The messages before it are
rendered with the generation prompt and the assistant's text is appended as is (no
end-of-turn), so the model's output picks up mid-message and the answer holds only the
continuation. `continue_final_message: false` renders that message as a finished turn and
opens a new one instead; `add_generation_prompt: false` renders without opening a turn.

Orders refused with a 400 (what is ambiguous or cannot come from a real exchange):
- two assistant messages in a row (which one is the answer being continued?);
- a `tool` message that does not answer an assistant message with `tool_calls` (directly,
  or after other tool results) — OpenAI refuses it too;
- `continue_final_message: true` when the last message is not an assistant's, or together
  with `add_generation_prompt: true` (contradictory, as vLLM says).
Accepted as llama-server and most templates do: consecutive user messages, system or
developer messages anywhere, a conversation without a user message.

Tools are rendered whatever the tool_choice (as vLLM does by default): an agent's last step
forbids tools to get an answer, and dropping their schemas from the prompt would change its
first tokens and lose the whole cached prefix. A named tool_choice renders every tool and takes
the grammar and parser of a plan that offers only the named one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from server.api.engine_bridge.chat_layer import ChatLayerError, ChatPlan, ChatTemplates
from server.api.engine_bridge.chat_request import ChatCompletionRequest, ChatMessage
from server.api.engine_bridge.tool_fallback import inject_tools
from server.api.http.errors import invalid
from server.settings import REASONING_FORMATS


@dataclass(frozen=True)
class ChatOptions:
    """The server's defaults for what a request may override (--reasoning-format,
    --chat-template-kwargs)."""

    reasoning_format: str = "auto"
    chat_template_kwargs: dict[str, Any] | None = None


@dataclass(frozen=True)
class Conversation:
    """A planned chat request: the prompt text and how its reply is constrained and read."""

    prompt: str
    plan: ChatPlan
    reasoning_format: str
    parse_tool_calls: bool
    forced_tools: bool  # tool_choice required or named: plan.grammar must constrain the reply


def check_order(messages: list[ChatMessage]) -> None:
    for i, (prev, cur) in enumerate(zip([None, *messages], messages)):
        if prev is not None and prev.role == cur.role == "assistant":
            raise invalid(f"messages[{i - 1}] and messages[{i}] are both assistant messages; merge them into one "
                          f"(a final assistant message is continued as a prefill)", param=f"messages.{i}",
                          code="invalid_message_order")
        if cur.role == "tool":
            j = i - 1
            while j >= 0 and messages[j].role == "tool":
                j -= 1
            if j < 0 or messages[j].role != "assistant" or not messages[j].tool_calls:
                raise invalid(f"messages[{i}] has role 'tool' but does not follow an assistant message with "
                              f"tool_calls", param=f"messages.{i}", code="invalid_message_order")


def continues_final_message(body: ChatCompletionRequest) -> bool:
    """Whether the last (assistant) message is continued as a prefill; 400 on contradictions."""
    last = body.messages[-1]
    is_open = last.role == "assistant" and not last.tool_calls
    if body.continue_final_message:
        if not is_open:
            raise invalid("continue_final_message needs the last message to be an assistant message without "
                          "tool_calls", param="continue_final_message", code="invalid_message_order")
        if body.add_generation_prompt:
            raise invalid("continue_final_message and add_generation_prompt cannot both be true",
                          param="add_generation_prompt")
        return True
    return is_open and body.continue_final_message is None


def _arguments_text(arguments: str | dict[str, Any]) -> str:
    if isinstance(arguments, dict):
        return json.dumps(arguments, ensure_ascii=False)
    try:
        value = json.loads(arguments or "{}")
    except json.JSONDecodeError as exc:
        raise invalid(f"tool call arguments are not valid JSON: {exc}", param="messages") from exc
    if not isinstance(value, dict):
        raise invalid("tool call arguments must be a JSON object", param="messages")
    return arguments or "{}"


def message_dict(m: ChatMessage) -> dict[str, Any]:
    """A message as OpenAI writes it, which is what llama.cpp's chat layer reads."""
    d: dict[str, Any] = {"role": m.role, "content": m.text()}
    if m.name:
        d["name"] = m.name
    if m.tool_call_id:
        d["tool_call_id"] = m.tool_call_id
    if m.reasoning_content:
        d["reasoning_content"] = m.reasoning_content
    if m.tool_calls:
        d["tool_calls"] = [{"id": c.id or "", "type": "function",
                            "function": {"name": c.function.name, "arguments": _arguments_text(c.function.arguments)}}
                           for c in m.tool_calls]
    return d


def template_kwargs(body: ChatCompletionRequest, options: ChatOptions,
                    supports_thinking: bool = True) -> tuple[dict[str, Any], bool]:
    """The template's extra variables and enable_thinking, with llama-server's defaults: past
    reasoning preserved where the template can keep it (`preserve_reasoning`; it also keeps each
    prompt an extension of the last, which the prefix cache needs), thinking on where the
    template has it; then the server's --chat-template-kwargs, then the request's."""
    kwargs: dict[str, Any] = {"preserve_reasoning": True}
    kwargs.update(options.chat_template_kwargs or {})
    kwargs.update(body.chat_template_kwargs or {})
    thinking = kwargs.get("enable_thinking", supports_thinking)
    if not isinstance(thinking, bool):
        raise invalid("chat_template_kwargs.enable_thinking must be a boolean", param="chat_template_kwargs")
    if body.reasoning_effort == "none":
        thinking = False
    elif body.reasoning_effort:
        kwargs["reasoning_effort"] = body.reasoning_effort
    return kwargs, thinking


def _apply(templates: ChatTemplates, request: dict[str, Any]) -> ChatPlan:
    """The chat layer's plan; 400 naming `tools` when only the tools make it fail (a parameter
    schema llama.cpp cannot turn into a grammar), else naming `messages`."""
    try:
        return templates.apply(request)
    except ChatLayerError as exc:
        if request.get("tools"):
            try:
                templates.apply({**request, "tools": None})
            except ChatLayerError:
                pass
            else:
                raise invalid(f"tools: llama.cpp's chat layer cannot use these tools: {exc}", param="tools",
                              code="invalid_schema") from exc
        raise invalid(f"the chat template could not render these messages: {exc}", param="messages",
                      code="template_error") from exc


def _reply_plan(templates: ChatTemplates, request: dict[str, Any]) -> ChatPlan:
    try:
        return templates.reply_plan(request)
    except ChatLayerError:
        return _apply(templates, request)  # the same failure, named as a render's


def plan_conversation(templates: ChatTemplates, body: ChatCompletionRequest, options: ChatOptions) -> Conversation:
    """Render `body` with the model's template; 400 on a bad order or what the template refuses."""
    check_order(body.messages)
    reasoning_format = body.reasoning_format or options.reasoning_format
    if reasoning_format not in REASONING_FORMATS:
        raise invalid(f"reasoning_format must be one of {', '.join(REASONING_FORMATS)}", param="reasoning_format")
    kwargs, thinking = template_kwargs(body, options, templates.supports_thinking)
    prefill = continues_final_message(body)
    messages = body.messages[:-1] if prefill else body.messages
    if not messages:  # a conversation that is only the prefilled assistant message
        messages_json: list[dict[str, Any]] = []
    else:
        messages_json = [message_dict(m) for m in messages]
    choice = body.tool_choice or ("auto" if body.tools else "none")
    tools = [t.model_dump(exclude_none=True) for t in body.tools or []]
    request: dict[str, Any] = {
        "messages": messages_json,
        "tools": tools or None,
        "tool_choice": choice if isinstance(choice, str) else "required",
        "add_generation_prompt": prefill or body.add_generation_prompt is not False,
        "reasoning_format": reasoning_format,
        "enable_thinking": thinking,
        "chat_template_kwargs": kwargs,
    }
    if body.parallel_tool_calls is not None:
        request["parallel_tool_calls"] = body.parallel_tool_calls
    fallback = bool(tools) and not templates.native_tools
    tool_turns = any(d.get("tool_calls") or d["role"] == "tool" for d in messages_json)
    if not templates.native_tools and (tools or tool_turns):
        # the model's template renders the conversation with the tools, calls and results written
        # into it (also when a request offers no tools: the history must render as before); the
        # reply follows Arbor's Hermes format (server.api.engine_bridge.tool_fallback), whose plan does not
        # depend on the messages
        rendered = _apply(templates, {**request, "messages": inject_tools(messages_json, tools), "tools": None})
        plan = replace(_reply_plan(templates.tool_format, request), prompt=rendered.prompt) if tools else rendered
    else:
        plan = _apply(templates, request)
    if not isinstance(choice, str):
        named = {**request, "tools": [t for t in tools if t["function"]["name"] == choice.function["name"]]}
        constrained = _reply_plan(templates.tool_format, named) if fallback else _apply(templates, named)
        plan = replace(constrained, prompt=plan.prompt)
    prompt = plan.prompt + (body.messages[-1].text() if prefill else "")
    forced = choice == "required" or not isinstance(choice, str)
    return Conversation(prompt, plan, reasoning_format, parse_tool_calls=bool(tools) and choice != "none",
                        forced_tools=forced)


def render_conversation(templates: ChatTemplates, body: ChatCompletionRequest,
                        options: ChatOptions | None = None) -> str:
    """The prompt text alone (what /apply-template returns)."""
    return plan_conversation(templates, body, options or ChatOptions()).prompt
