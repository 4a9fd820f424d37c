"""harness/manifest.py: the manifest line format the workbench writes and the replay reads."""

import io

import pytest

from app.agent.cache_hints import hint_key
from harness.manifest import ManifestError, ManifestLine, dumps_manifest, parse_manifest, read_manifest, write_manifest


def test_manifest_round_trip(tmp_path):
    lines = [ManifestLine(0.0, "s", "b", {"model": "m", "messages": [{"role": "user", "content": "hi"}]}, 5),
             ManifestLine(1.5, "s", "b2", {"model": "m", "messages": []}, None)]
    path = tmp_path / "m.jsonl"
    assert write_manifest(lines, path) == 2
    assert read_manifest(path) == lines
    buffer = io.StringIO()
    write_manifest(lines, buffer)
    assert buffer.getvalue() == dumps_manifest(lines)
    assert list(parse_manifest(dumps_manifest(lines) + "\n\n")) == lines


@pytest.mark.parametrize("text,fragment", [("{not json", "not JSON"), ("[1]", "JSON object"),
                                           ('{"t": 1, "session_id": "s", "branch_id": "b"}', "lacks body"),
                                           ('{"t": 1, "session_id": "s", "branch_id": "b", "body": {}}', "messages")])
def test_manifest_rejects_bad_lines(text, fragment):
    with pytest.raises(ManifestError, match=fragment) as info:
        list(parse_manifest("\n" + text, source="x.jsonl"))
    assert "x.jsonl:2" in str(info.value)


def test_a_lines_cache_session_is_the_workbenchs_hint_key():
    line = ManifestLine(0.0, "session-1", "branch-2", {"messages": []})
    assert line.cache_session == hint_key("session-1", "branch-2") == "session-1/branch-2"


def test_a_negative_wait_is_refused():
    with pytest.raises(ManifestError, match="after_s"):
        ManifestLine(t=0.0, session_id="s", branch_id="main", body={"messages": []}, after_s=-1.0)
