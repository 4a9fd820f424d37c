"""app/agent/messages.py: langchain-core messages <-> OpenAI dicts, exact both ways."""

import json

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from app.agent.messages import from_openai, openai_tool_calls, to_openai

CONVERSATION = [
    {"role": "user", "content": "check pump-7"},
    {"role": "assistant", "content": "", "tool_calls": [
        # the model's own spacing and key order must survive (the server's prefix cache sees these bytes)
        {"id": "c1", "type": "function", "function": {"name": "read", "arguments": '{"b": [1,2],  "a":"é"}'}},
        {"id": "c2", "type": "function", "function": {"name": "read", "arguments": "{not json"}},
        {"id": "c3", "type": "function", "function": {"name": "read", "arguments": "[1]"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": '{"ok":true}'},
    {"role": "tool", "tool_call_id": "c2", "content": "Error from tool read: ..."},
    {"role": "tool", "tool_call_id": "c3", "content": "Error from tool read: ..."},
    {"role": "assistant", "content": "pump-7 is fine"},
    {"role": "assistant", "content": ""},
]


def test_round_trip_is_exact_to_the_byte():
    """Exact, but for the arguments of invalid calls (no JSON object), which go back as `{}`: a
    server that checks the history refuses them (arbor-server: 400), and their tool answers say
    what was wrong (issue 59, item 4)."""
    messages = from_openai(CONVERSATION)
    expected = json.loads(json.dumps(CONVERSATION))
    for call in expected[1]["tool_calls"][1:]:
        call["function"]["arguments"] = "{}"
    assert json.dumps(to_openai(messages)) == json.dumps(expected)
    assert from_openai(to_openai(messages))[1].tool_calls[0]["args"] == {"b": [1, 2], "a": "é"}


def test_tool_calls_become_langchain_tool_calls_and_invalid_ones_keep_their_error():
    call_message = from_openai(CONVERSATION)[1]
    assert isinstance(call_message, AIMessage)
    assert call_message.tool_calls == [{"name": "read", "args": {"b": [1, 2], "a": "é"}, "id": "c1",
                                        "type": "tool_call"}]
    errors = {c["id"]: c["error"] for c in call_message.invalid_tool_calls}
    assert "not valid JSON" in errors["c2"] and errors["c3"] == "arguments must be a JSON object, got list"
    assert [type(m) for m in from_openai(CONVERSATION)[2:5]] == [ToolMessage] * 3


def test_messages_made_by_langchain_code_are_written_in_openai_format():
    made = [HumanMessage("hi"),
            AIMessage("", tool_calls=[{"name": "add", "args": {"a": 1}, "id": "t1"}]),
            ToolMessage("2", tool_call_id="t1", name="add", status="success")]
    assert to_openai(made) == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "",
         "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}]},
        {"role": "tool", "tool_call_id": "t1", "content": "2"}]  # no "name": OpenAI's tool message has none


def test_changed_arguments_are_written_anew_not_replayed_from_the_raw_text():
    message = from_openai(CONVERSATION[1:2])[0]
    changed = message.model_copy(update={"tool_calls": [{**message.tool_calls[0], "args": {"a": "x"}}]})
    calls = {c["id"]: c["function"]["arguments"] for c in openai_tool_calls(changed)}
    assert calls["c1"] == '{"a": "x"}' and calls["c2"] == "{}"


def test_a_thinking_models_reasoning_goes_back_with_the_history():
    """reasoning_content (the server's, from a thinking model) survives the round trip, with and
    without tool calls: the model's template decides what of it the next prompt keeps."""
    history = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get", "arguments": "{}"}}],
         "reasoning_content": "I should call get."},
        {"role": "tool", "tool_call_id": "c1", "content": "12 C"},
        {"role": "assistant", "content": "12 C.", "reasoning_content": "Done."},
    ]
    messages = from_openai(history)
    assert messages[3].additional_kwargs["reasoning_content"] == "Done." and messages[3].content == "12 C."
    assert to_openai(messages) == history
