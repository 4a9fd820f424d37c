"""A chat request as its Responses and Messages equivalents (harness/workloads/api_shapes.py), and back.

The strongest check needs no model: arbor-server's own translations (server/api/protocols/openai_responses,
server/api/protocols/anthropic_messages) turn the translated bodies back into the chat messages and tools of the
original, so every API renders the same prompt. The real-server figures are in
tests/harness/serving/test_replay_three_apis.py and bench/api_parity.py.
"""

import json

import pytest

from harness.manifest import ManifestLine
from harness.workloads.api_shapes import (
    continues_with_tool_result,
    line_as,
    lines_as,
    returned_tools,
    to_chat,
    to_messages,
    to_responses,
)
from harness.workloads.generators import SCENARIOS, agent_sessions, workload_ideal
from server.api.protocols.anthropic_messages.request import MessagesRequest, parse_request
from server.api.protocols.anthropic_messages.translate import chat_request
from server.api.protocols.openai_responses.request import ResponsesRequest
from server.api.protocols.openai_responses.translate import plan_response
from server.settings import ServerSettings

TOOL = {"type": "function", "function": {"name": "query_logs", "description": "Search logs",
                                         "parameters": {"type": "object", "properties": {"q": {"type": "string"}},
                                                        "required": ["q"]}}}

CHAT = {
    "model": "m", "temperature": 0.0, "max_tokens": 32, "tools": [TOOL],
    "messages": [
        {"role": "system", "content": "You are an incident responder."},
        {"role": "user", "content": "Task: find the cause."},
        {"role": "assistant", "content": None, "reasoning_content": "look at the logs",
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "query_logs", "arguments": json.dumps({"q": "timeout"})}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Result: 3 timeouts"},
        {"role": "assistant", "content": "Three timeouts."},
        {"role": "user", "content": "And now?"},
    ],
}


def _plain(messages):
    """Chat messages compared as the prompt sees them: no content and empty content alike, arguments as objects."""
    out = []
    for m in messages:
        m = {k: v for k, v in m.items() if v is not None}
        if m.get("content") == "":
            m.pop("content")
        for call in m.get("tool_calls") or []:
            args = call["function"]["arguments"]
            call["function"]["arguments"] = json.loads(args) if isinstance(args, str) else args
        out.append(m)
    return out


def _server_chat_from_responses(body):
    planned = plan_response(ResponsesRequest.model_validate(body), "resp_x", None, max_messages=1024)
    return planned.chat.model_dump(mode="json", exclude_none=True)


def _server_chat_from_messages(body):
    chat = chat_request(parse_request(MessagesRequest, body), ServerSettings())
    return chat.model_dump(mode="json", exclude_none=True)


def test_responses_body_shape():
    body = to_responses(CHAT)
    assert body["instructions"] == "You are an incident responder."
    assert [i["type"] for i in body["input"]] == ["message", "reasoning", "function_call", "function_call_output",
                                                  "message", "message"]
    assert body["input"][2] == {"type": "function_call", "call_id": "call_1", "name": "query_logs",
                                "arguments": '{"q": "timeout"}'}
    assert body["tools"] == [{"type": "function", "name": "query_logs", "description": "Search logs",
                              "parameters": TOOL["function"]["parameters"]}]
    assert (body["max_output_tokens"], body["store"], body["model"], body["temperature"]) == (32, False, "m", 0.0)
    assert "messages" not in body and "max_tokens" not in body


def test_messages_body_shape():
    body = to_messages(CHAT)
    assert body["system"] == "You are an incident responder."
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user", "assistant", "user"]
    assert body["messages"][1]["content"] == [
        {"type": "thinking", "thinking": "look at the logs", "signature": ""},
        {"type": "tool_use", "id": "call_1", "name": "query_logs", "input": {"q": "timeout"}}]
    assert body["messages"][2]["content"] == [{"type": "tool_result", "tool_use_id": "call_1",
                                               "content": "Result: 3 timeouts"}]
    assert body["tools"] == [{"name": "query_logs", "description": "Search logs",
                              "input_schema": TOOL["function"]["parameters"]}]
    assert body["max_tokens"] == 32 and "tool_choice" not in body


def test_tool_results_and_the_next_user_text_make_one_user_turn():
    chat = {"messages": [{"role": "user", "content": "go"},
                         {"role": "assistant", "tool_calls": [
                             {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                             {"id": "b", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                         {"role": "tool", "tool_call_id": "a", "content": "A"},
                         {"role": "tool", "tool_call_id": "b", "content": "B"},
                         {"role": "user", "content": "thanks"}]}
    turn = to_messages(chat, default_max_tokens=7)["messages"][2]
    assert [b["type"] for b in turn["content"]] == ["tool_result", "tool_result", "text"]
    assert to_messages(chat, default_max_tokens=7)["max_tokens"] == 7


@pytest.mark.parametrize("choice, parallel, responses, messages", [
    ("auto", None, "auto", {"type": "auto"}),
    ("required", None, "required", {"type": "any"}),
    ("none", None, "none", {"type": "none"}),
    ({"type": "function", "function": {"name": "query_logs"}}, False, {"type": "function", "name": "query_logs"},
     {"type": "tool", "name": "query_logs", "disable_parallel_tool_use": True}),
])
def test_tool_choice(choice, parallel, responses, messages):
    chat = {**CHAT, "tool_choice": choice, **({"parallel_tool_calls": parallel} if parallel is not None else {})}
    assert to_responses(chat)["tool_choice"] == responses
    assert to_messages(chat)["tool_choice"] == messages


def test_a_system_message_mid_conversation_has_no_messages_form():
    chat = {"messages": [{"role": "user", "content": "a"}, {"role": "system", "content": "b"}]}
    with pytest.raises(ValueError, match="system"):
        to_messages(chat)


@pytest.mark.parametrize("api", ["responses", "messages"])
def test_the_server_reads_the_translation_back_as_the_original_chat(api):
    """Same messages and tools after arbor-server's own translation: the same prompt."""
    body = {"model": "m", **(to_responses(CHAT) if api == "responses" else to_messages(CHAT))}
    served = _server_chat_from_responses(body) if api == "responses" else _server_chat_from_messages(body)
    assert _plain(served["messages"]) == _plain(CHAT["messages"])
    assert served["tools"] == [TOOL]
    assert served["max_tokens"] == 32
    # and this module's reading of the body agrees with the server's
    assert _plain(to_chat(api, body)["messages"]) == _plain(served["messages"])
    assert to_chat(api, body)["tools"] == [TOOL]


@pytest.mark.parametrize("api", ["responses", "messages"])
def test_the_tools_a_body_returns_read_the_same_through_every_api(api):
    work = agent_sessions(sessions=2, turns=3, system_len=40, tool_result_len=20)
    names = [returned_tools("chat", line.body) for line in work.lines]
    known = {t["function"]["name"] for _, tools in SCENARIOS.values() for t in tools}
    assert names.count(None) == 2 and all(n in known for n in names if n), names
    assert [returned_tools(api, line.body) for line in lines_as(work.lines, api)] == names
    two = {"messages": [{"role": "user", "content": "go"}, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "zeta", "arguments": "{}"}},
        {"id": "b", "type": "function", "function": {"name": "alpha", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "a", "content": "1"}, {"role": "tool", "tool_call_id": "b", "content": "2"}]}
    assert returned_tools("chat", two) == "alpha+zeta", "calls that ran together: one wait, named by both"


@pytest.mark.parametrize("api", ["responses", "messages"])
def test_a_generated_agent_workload_translates_line_by_line(api):
    work = agent_sessions(sessions=2, turns=3, system_len=40, tool_result_len=20)
    lines = lines_as(work.lines, api)
    assert [ln.api for ln in lines] == [api] * len(work.lines)
    for chat_line, line in zip(work.lines, lines):
        assert (line.t, line.session_id, line.branch_id, line.expected_output_tokens) == (
            chat_line.t, chat_line.session_id, chat_line.branch_id, chat_line.expected_output_tokens)
        body = {"model": "m", **line.body}
        served = _server_chat_from_responses(body) if api == "responses" else _server_chat_from_messages(body)
        assert _plain(served["messages"]) == _plain(chat_line.body["messages"])
        assert continues_with_tool_result(api, line.body) == continues_with_tool_result("chat", chat_line.body)
    # the ideal is a property of the workload, whatever the API
    assert workload_ideal(lines).to_dict() == work.ideal.to_dict()


def test_only_chat_lines_translate():
    line = ManifestLine(0.0, "s", "main", {"messages": [{"role": "user", "content": "hi"}]}, 4)
    messages = line_as(line, "messages")
    assert messages.body["max_tokens"] == 4  # the expected output when the chat body has no limit
    assert line_as(messages, "messages") is messages
    with pytest.raises(ValueError, match="only chat lines"):
        line_as(messages, "responses")


def test_responses_string_input_and_message_string_content_read_back():
    assert to_chat("responses", {"input": "hi", "instructions": "sys"})["messages"] == [
        {"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}]
    assert to_chat("messages", {"system": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                                "messages": [{"role": "user", "content": "hi"}]})["messages"] == [
        {"role": "system", "content": "a\nb"}, {"role": "user", "content": "hi"}]
    error = {"messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
                          {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "is_error": True,
                                                        "content": [{"type": "text", "text": "boom"}]}]}]}
    assert to_chat("messages", error)["messages"][1] == {"role": "tool", "tool_call_id": "t", "content": "Error: boom"}
    assert continues_with_tool_result("messages", error)
