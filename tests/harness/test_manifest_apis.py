"""Manifest lines of the three APIs: the ``api`` field, old (chat-only) manifests read unchanged,
the body sent to each API, hints, and the measurement of each API's stream."""

import json

import pytest

from app.replay.cli import main as replay_main
from harness.manifest import ManifestError, ManifestLine, dumps_manifest, parse_manifest
from harness.serving.runner import ReplaySettings, hint_states, prepare_body
from harness.serving.streamed_request import Measurement, accumulator_for

OLD_LINE = ('{"t":0.5,"session_id":"s","branch_id":"main","body":{"messages":[{"role":"user","content":"hi"}],'
            '"max_tokens":4},"expected_output_tokens":4}')


def test_a_line_without_api_is_chat_and_is_written_back_the_same():
    (line,) = parse_manifest(OLD_LINE)
    assert (line.api, line.path) == ("chat", "/v1/chat/completions")
    assert dumps_manifest([line]) == OLD_LINE + "\n"  # a chat manifest stays the file it was


@pytest.mark.parametrize("api, body, path", [
    ("responses", {"input": [{"role": "user", "content": "hi"}], "store": False}, "/v1/responses"),
    ("responses", {"input": "hi"}, "/v1/responses"),
    ("messages", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}, "/v1/messages"),
    ("chat", {"messages": []}, "/v1/chat/completions"),
])
def test_lines_of_each_api_round_trip(api, body, path):
    line = ManifestLine(1.0, "s", "b", body, 8, api=api)
    (back,) = parse_manifest(dumps_manifest([line]))
    assert back == line and back.path == path
    assert ("api" in json.loads(line.to_json())) == (api != "chat")


@pytest.mark.parametrize("text, fragment", [
    ('{"t": 1, "session_id": "s", "branch_id": "b", "body": {"input": "x"}, "api": "completions"}', "api must be"),
    ('{"t": 1, "session_id": "s", "branch_id": "b", "body": {"messages": []}, "api": "responses"}', "an input"),
    ('{"t": 1, "session_id": "s", "branch_id": "b", "body": {"input": "x"}, "api": "messages"}', "messages list"),
])
def test_bad_api_lines_name_the_line(text, fragment):
    with pytest.raises(ManifestError, match=fragment) as info:
        list(parse_manifest(text, source="m.jsonl"))
    assert "m.jsonl:1" in str(info.value)
    with pytest.raises(ManifestError, match="api must be"):
        ManifestLine(0.0, "s", "b", {"messages": []}, api="completions")


SETTINGS = ReplaySettings(base_url="http://127.0.0.1:1", progress=False)


def test_prepare_body_per_api():
    chat = prepare_body(ManifestLine(0.0, "s", "b", {"messages": [], "cache": {"pin": True}}, 5), SETTINGS, "m")
    assert chat == {"messages": [], "stream": True, "stream_options": {"include_usage": True}, "model": "m",
                    "max_tokens": 5}
    responses = prepare_body(ManifestLine(0.0, "s", "b", {"input": "x", "store": True, "cache": {}}, 5,
                                          api="responses"), SETTINGS, "m")
    assert responses == {"input": "x", "store": False, "stream": True, "model": "m", "max_output_tokens": 5}
    messages = prepare_body(ManifestLine(0.0, "s", "b", {"messages": [], "max_tokens": 9}, 5, api="messages"),
                            SETTINGS, "m")
    assert messages == {"messages": [], "max_tokens": 9, "stream": True, "model": "m"}
    forced = ReplaySettings(base_url="http://127.0.0.1:1", progress=False, force_output_length=True)
    assert prepare_body(ManifestLine(0.0, "s", "b", {"messages": [], "max_tokens": 9}, 5, api="messages"),
                        forced, "m")["max_tokens"] == 5
    no_limit = prepare_body(ManifestLine(0.0, "s", "b", {"messages": []}, None, api="messages"), SETTINGS, "m")
    assert no_limit["max_tokens"] == 1024  # the API requires one


def test_hint_states_read_tool_results_in_every_api():
    call = {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}
    lines = [
        ManifestLine(0.0, "r", "b", {"input": "go"}, api="responses"),
        ManifestLine(0.0, "r", "b", {"input": ["go", call, {"type": "function_call_output", "call_id": "c",
                                                             "output": "x"}]}, api="responses"),
        ManifestLine(0.0, "m", "b", {"messages": [{"role": "user", "content": "go"}]}, api="messages"),
        ManifestLine(0.0, "m", "b", {"messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "x"}]}]},
            api="messages"),
        ManifestLine(0.0, "m", "b", {"messages": [{"role": "user", "content": "next question"}]}, api="messages"),
    ]
    assert hint_states(lines) == ["tool_wait", "done", "tool_wait", "done", "done"]


def _feed(api, events):
    m = Measurement(started=0.0)
    acc = accumulator_for(api, m)
    for now, event in enumerate(events, start=1):
        acc.feed(event, float(now))
    acc.finish()
    return m


def test_responses_stream_measurement():
    usage = {"input_tokens": 120, "input_tokens_details": {"cached_tokens": 100}, "output_tokens": 7}
    m = _feed("responses", [
        {"type": "response.created", "response": {}},
        {"type": "response.in_progress", "response": {}},
        {"type": "response.output_item.added", "item": {"type": "message"}},
        {"type": "response.output_text.delta", "delta": "Hi"},
        {"type": "response.completed", "response": {"status": "completed", "usage": usage,
                                                    "output": [{"type": "message"}],
                                                    "arbor": {"cache": {"source": "S"}}}},
    ])
    assert (m.first_token, m.prompt_tokens, m.cached_tokens, m.completion_tokens) == (4.0, 120, 100, 7)
    assert (m.finish_reason, m.cache_source, m.cached_tokens_from, m.error) == ("stop", "S", "usage", None)
    # a function call counts from the item that names it; max_output_tokens is chat's "length"
    m = _feed("responses", [{"type": "response.created"},
                            {"type": "response.output_item.added", "item": {"type": "function_call"}},
                            {"type": "response.incomplete", "response": {
                                "status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"},
                                "usage": usage}}])
    assert (m.first_token, m.finish_reason) == (2.0, "length")
    m = _feed("responses", [{"type": "response.created"},
                            {"type": "response.failed", "response": {"error": {"message": "boom"}}}])
    assert m.error == "stream error: boom"


def test_messages_stream_measurement():
    m = _feed("messages", [
        {"type": "message_start", "message": {"usage": {"input_tokens": 120, "output_tokens": 0,
                                                        "cache_read_input_tokens": 0,
                                                        "cache_creation_input_tokens": 0}}},
        {"type": "ping"},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use", "id": "t", "name": "f"}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": "{}"}},
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "arbor": {"cache": {"source": "A"}},
         "usage": {"input_tokens": 20, "cache_read_input_tokens": 90, "cache_creation_input_tokens": 10,
                   "output_tokens": 5}},
        {"type": "message_stop"},
    ])
    # Anthropic's input_tokens leaves out what the cache read or wrote: the prompt is all three
    assert (m.first_token, m.prompt_tokens, m.cached_tokens, m.completion_tokens) == (3.0, 120, 90, 5)
    assert (m.finish_reason, m.cache_source) == ("tool_calls", "A")
    m = _feed("messages", [{"type": "message_start", "message": {"usage": {"input_tokens": 5}}},
                           {"type": "error", "error": {"type": "api_error", "message": "engine failed"}}])
    assert m.error == "stream error: engine failed"


def test_cli_convert_writes_the_same_requests_for_another_api(tmp_path, capsys):
    source = tmp_path / "chat.jsonl"
    source.write_text(OLD_LINE + "\n")
    assert replay_main(["convert", str(source), "--api", "messages", "--out", str(tmp_path / "m.jsonl")]) == 0
    (line,) = parse_manifest((tmp_path / "m.jsonl").read_text())
    assert line.api == "messages" and line.body["messages"] == [{"role": "user", "content": [
        {"type": "text", "text": "hi"}]}] and line.body["max_tokens"] == 4
    assert replay_main(["generate", "agent-sessions", "--sessions", "1", "--turns", "2", "--api", "responses",
                        "--out", str(tmp_path / "r.jsonl")]) == 0
    lines = list(parse_manifest((tmp_path / "r.jsonl").read_text()))
    assert [ln.api for ln in lines] == ["responses", "responses"] and "instructions" in lines[0].body
    capsys.readouterr()


def test_a_chat_line_rendered_into_a_completions_prompt_goes_to_completions():
    """bench.run_all --same-prompts replaces each chat body with the prompt arbor renders for it."""
    from harness.manifest import ManifestLine
    from harness.serving.runner import request_path

    line = ManifestLine(t=0.0, session_id="s", branch_id="main", body={"messages": [{"role": "user", "content": "x"}]})
    assert request_path(line, line.body) == "/v1/chat/completions"
    assert request_path(line, {"prompt": "<|im_start|>user\nx", "max_tokens": 4}) == "/v1/completions"
    assert request_path(ManifestLine(t=0.0, session_id="s", branch_id="main", body={"input": "x"}, api="responses"),
                        {"input": "x"}) == "/v1/responses"
