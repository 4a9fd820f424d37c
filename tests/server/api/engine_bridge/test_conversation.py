"""Message-order checks and assistant prefill, on a ChatML template rendered by llama.cpp's chat
layer (no model needed)."""

from __future__ import annotations

import pytest

from server.api.engine_bridge.chat_layer import ChatTemplates
from server.api.engine_bridge.chat_request import ChatCompletionRequest
from server.api.engine_bridge.conversation import render_conversation
from server.api.http.errors import APIError

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
T = ChatTemplates(None, CHATML)
CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


def render(messages, **fields) -> str:
    return render_conversation(T, ChatCompletionRequest(messages=messages, **fields))


def u(text): return {"role": "user", "content": text}
def a(text): return {"role": "assistant", "content": text}


def test_final_assistant_message_is_continued():
    assert render([u("Hi"), a("Hello, I am")]) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello, I am"
    assert render([a("Once upon")]) == "<|im_start|>assistant\nOnce upon"
    assert render([u("Hi"), a("Hello")], continue_final_message=True).endswith("assistant\nHello")


def test_continue_final_message_false_opens_a_new_turn():
    assert render([u("Hi"), a("Hello")], continue_final_message=False).endswith(
        "assistant\nHello<|im_end|>\n<|im_start|>assistant\n")
    assert render([u("Hi"), a("Hello")], continue_final_message=False, add_generation_prompt=False).endswith(
        "assistant\nHello<|im_end|>\n")
    assert render([u("Hi")], add_generation_prompt=False) == "<|im_start|>user\nHi<|im_end|>\n"


def test_lenient_orders_are_accepted():
    render([u("a"), u("b")])
    render([{"role": "system", "content": "s"}, u("a"), a("b"), {"role": "system", "content": "s2"}, u("c")])
    render([{"role": "system", "content": "s"}])
    render([u("q"), {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "content": "1", "tool_call_id": "c1"}, {"role": "tool", "content": "2"}])


@pytest.mark.parametrize("messages,fields,where", [
    ([u("Hi"), a("x"), a("y")], {}, "both assistant"),
    ([u("Hi"), a("x"), a("y"), u("z")], {}, "both assistant"),
    ([u("Hi"), {"role": "tool", "content": "r"}], {}, "role 'tool'"),
    ([{"role": "tool", "content": "r"}], {}, "role 'tool'"),
    ([u("Hi"), a("plain"), {"role": "tool", "content": "r"}], {}, "role 'tool'"),
    ([u("Hi")], {"continue_final_message": True}, "continue_final_message needs"),
    ([u("Hi"), a("x")], {"continue_final_message": True, "add_generation_prompt": True}, "cannot both"),
])
def test_malformed_orders_are_400(messages, fields, where):
    with pytest.raises(APIError) as err:
        render(messages, **fields)
    assert err.value.status == 400 and where in err.value.message


def test_a_tool_less_template_writes_calls_and_results_as_text_even_without_tools():
    """The history of a tool round trip renders the same whether or not the request still offers
    the tools (the Hermes blocks of server.api.engine_bridge.tool_fallback), so the prefix stays reusable."""
    history = [u("q"), {"role": "assistant", "content": None, "tool_calls": [CALL]},
               {"role": "tool", "content": "42", "tool_call_id": "c1"}]
    text = render(history)
    assert '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>' in text
    assert "<tool_response>\n42\n</tool_response>" in text
