"""AIPerf inputs.json import and the manifest round trip (write, read back, equal)."""

import json

import pytest

from harness.manifest import read_manifest, write_manifest
from harness.workloads.generators import agent_sessions
from harness.workloads.manifest_import import AIPerfFormatError, aiperf_to_manifest, import_aiperf_inputs

AIPERF_DOC = {
    "data": [
        {"session_id": "session-001", "payloads": [
            {"messages": [{"role": "user", "content": "Hello"}], "model": "Qwen/Qwen3-0.6B", "max_tokens": 1024},
            {"messages": [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi there!"},
                          {"role": "user", "content": "How are you?"}],
             "model": "Qwen/Qwen3-0.6B", "max_completion_tokens": 64, "stream": True},
        ]},
        {"session_id": None, "payloads": [{"messages": [{"role": "user", "content": "Other"}]}]},
    ]
}


def test_import_aiperf_sessions(tmp_path):
    path = tmp_path / "inputs.json"
    path.write_text(json.dumps(AIPERF_DOC))
    lines = import_aiperf_inputs(path, session_interval_s=2.0)
    assert [(ln.session_id, ln.t, ln.expected_output_tokens) for ln in lines] == [
        ("session-001", 0.0, 1024), ("session-001", 0.0, 64), ("aiperf-1", 2.0, None)]
    assert lines[1].body == AIPERF_DOC["data"][0]["payloads"][1]  # bodies verbatim
    # and through the manifest file
    write_manifest(lines, tmp_path / "m.jsonl")
    assert read_manifest(tmp_path / "m.jsonl") == lines


@pytest.mark.parametrize("document, message", [
    ([], "data"),
    ({"data": [{"payloads": "x"}]}, "payloads"),
    ({"data": [{"session_id": "a", "payloads": [{"foo": 1}]}]}, "payloads\\[0\\] must be an OpenAI chat"),
    ({"data": [{"session_id": "a", "payloads": [{"messages": "hi"}]}]}, "a messages list"),
    # replay sends chat requests only: a completions body is refused at import, not mid-replay
    ({"data": [{"session_id": "a", "payloads": [{"messages": [{"role": "user", "content": "x"}]},
                                                {"prompt": "Hello", "max_tokens": 8}]}]},
     "payloads\\[1\\] is a completions body \\(prompt\\)"),
    ({"data": [{"session_id": "a", "payloads": []}, {"session_id": "a", "payloads": []}]}, "twice"),
])
def test_bad_aiperf_documents_are_explained(document, message):
    with pytest.raises(AIPerfFormatError, match=message):
        aiperf_to_manifest(document)


def test_not_json(tmp_path):
    path = tmp_path / "inputs.json"
    path.write_text("{nope")
    with pytest.raises(AIPerfFormatError, match="not valid JSON"):
        import_aiperf_inputs(path)


def test_generated_manifest_round_trip(tmp_path):
    lines = agent_sessions(sessions=2, turns=3, system_len=20, user_len=5, tool_result_len=5).lines
    write_manifest(lines, tmp_path / "agent.jsonl")
    assert read_manifest(tmp_path / "agent.jsonl") == lines
