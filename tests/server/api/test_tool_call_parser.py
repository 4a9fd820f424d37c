"""The tool-call parser on its own: formats, streaming holdback, cut-off calls."""

import json

from server.api.tool_calls import ContentDelta, ParsedToolCall, ToolCallStreamParser

KNOWN = {"get_time", "get_weather"}


def run(parts):
    p = ToolCallStreamParser(KNOWN)
    out = [x for part in parts for x in p.feed(part)] + p.finish()
    content = "".join(x.text for x in out if isinstance(x, ContentDelta))
    return content, [x for x in out if isinstance(x, ParsedToolCall)], p


def test_hermes_block_split_across_deltas_is_never_streamed_as_content():
    text = 'Sure.<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>'
    parts = [text[i:i + 3] for i in range(0, len(text), 3)]
    content, calls, _ = run(parts)
    assert content == "Sure."
    assert [c.name for c in calls] == ["get_time"] and json.loads(calls[0].arguments) == {"zone": "UTC"}


def test_plain_json_reply_is_a_call_and_unknown_functions_stay_text():
    content, calls, _ = run(['{"name": "get_weather", "arguments": {"city": "Oslo"}}'])
    assert content == "" and calls[0].name == "get_weather"
    content, calls, _ = run(['{"name": "rm_rf", "arguments": {}}'])
    assert calls == [] and "rm_rf" in content


def test_a_second_call_cut_off_by_max_tokens_is_dropped():
    text = ('<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "get_weather", "argum')
    content, calls, parser = run([text])
    assert [c.name for c in calls] == ["get_time"] and parser.truncated_call
    assert "<tool_call>" not in content


def test_text_that_only_looks_like_a_tag_start_is_released():
    content, calls, _ = run(["a <tool", "box> b"])
    assert content == "a <toolbox> b" and calls == []
