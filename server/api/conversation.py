"""From chat messages to prompt text: message-order checks and assistant prefill.

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
"""

from __future__ import annotations

from server.api.chat_template import ChatTemplate
from server.api.errors import invalid
from server.api.schemas import ChatCompletionRequest, ChatMessage, Tool


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


def render_conversation(template: ChatTemplate, body: ChatCompletionRequest, tools: list[Tool] | None) -> str:
    check_order(body.messages)
    if continues_final_message(body):
        return template.render(body.messages[:-1], tools) + body.messages[-1].text()
    return template.render(body.messages, tools, add_generation_prompt=body.add_generation_prompt is not False)
