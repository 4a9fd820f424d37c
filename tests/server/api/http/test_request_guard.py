"""Unit tests of the request guard's checks, the grammar checks, and the limit flags."""

from __future__ import annotations

import json

import pytest

from server.api.engine_bridge.grammars import json_schema_grammar
from server.api.http.errors import APIError, ErrorJSONResponse
from server.api.http.request_guard import Limits, check_body
from server.cli import build_parser, settings_from_args
from server.settings import ServerSettings

LIMITS = Limits(body_bytes=1024, json_depth=8, messages=3, tools=2, stop=1, stop_chars=4)


def refused(body: bytes, limits: Limits = LIMITS) -> APIError:
    with pytest.raises(APIError) as info:
        check_body(body, limits)
    return info.value


def test_lone_surrogates_are_named_with_their_path():
    err = refused(b'{"messages": [{"role": "user", "content": "ok"}, {"content": "a\\udc00"}]}')
    assert err.status == 400 and err.code == "invalid_unicode" and err.param == "messages.1.content"
    assert "\\udc00" in err.message
    assert refused(b'{"x": {"\\ud800": 1}}').param == "x.\ud800"


def test_surrogate_pairs_and_nul_in_text_pass():
    check_body(b'{"messages": [{"content": "\\ud83d\\ude00 a\\u0000b"}]}', LIMITS)


def test_depth_is_counted_in_containers():
    check_body(json.dumps({"a": [[[[[[[1]]]]]]]}).encode(), LIMITS)  # 8 nested containers: the limit
    assert refused(json.dumps({"a": [[[[[[[[1]]]]]]]]}).encode()).code == "too_deeply_nested"  # 9
    assert refused(b"[" * 50_000 + b"]" * 50_000).code == "too_deeply_nested"  # past Python's own limit


@pytest.mark.parametrize("key,value,code", [("messages", [{}] * 4, "too_many_messages"),
                                             ("tools", [{}] * 3, "too_many_tools"),
                                             ("stop", ["a", "b"], "too_many_stop")])
def test_counts_name_the_flag(key, value, code):
    err = refused(json.dumps({key: value}).encode())
    assert err.code == code and err.param == key and "--max-" in err.message


@pytest.mark.parametrize("stop", ["abcde", ["abcde"]])
def test_a_stop_string_too_long_names_the_flag(stop):
    err = refused(json.dumps({"stop": stop}).encode())
    assert err.status == 400 and err.code == "stop_too_long" and err.param == "stop"
    assert "5 characters" in err.message and "--max-stop-chars" in err.message


def test_at_the_limits_passes_and_non_json_is_left_to_the_route():
    check_body(json.dumps({"messages": [{}] * 3, "tools": [{}] * 2, "stop": ["abcd"]}).encode(), LIMITS)
    check_body(json.dumps({"stop": "abcd"}).encode(), LIMITS)
    check_body(b'{"messages": [', LIMITS)
    check_body(b"", LIMITS)


SIZES = Limits(body_bytes=2**20, json_depth=64, messages=8, tools=8, stop=4, stop_chars=8, tools_bytes=200,
               grammar_chars=20, schema_bytes=100, logit_bias=3)


def _tools(description: str) -> list[dict]:
    return [{"type": "function", "function": {"name": "f", "description": description}}]


def test_tool_definitions_larger_than_the_limit_name_the_flag():
    small = _tools("d" * 100)
    check_body(json.dumps({"tools": small}).encode(), SIZES)
    err = refused(json.dumps({"tools": _tools("d" * 200)}).encode(), SIZES)
    assert err.status == 400 and err.code == "tools_too_large" and err.param == "tools"
    assert "--max-tools-kib" in err.message
    # counted as UTF-8: 60 three-byte characters weigh 180 bytes
    assert refused(json.dumps({"tools": _tools("\u20ac" * 60)}).encode(), SIZES).code == "tools_too_large"


def test_a_grammar_longer_than_the_limit_names_the_flag():
    check_body(json.dumps({"grammar": 'root ::= "' + "a" * 9 + '"'}).encode(), SIZES)  # 20 characters
    err = refused(json.dumps({"grammar": 'root ::= "' + "a" * 10 + '"'}).encode(), SIZES)
    assert err.code == "grammar_too_large" and err.param == "grammar" and "--max-grammar-chars" in err.message


@pytest.mark.parametrize("field,param", [
    (lambda s: {"response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": s}}},
     "response_format.json_schema"),
    (lambda s: {"json_schema": s}, "json_schema")])
def test_a_json_schema_larger_than_the_limit_names_the_flag(field, param):
    check_body(json.dumps(field({"enum": ["a" * 80]})).encode(), SIZES)
    err = refused(json.dumps(field({"enum": ["a" * 100]})).encode(), SIZES)
    assert err.code == "schema_too_large" and err.param == param and "--max-schema-kib" in err.message


@pytest.mark.parametrize("bias", [{"1": 1, "2": 1, "3": 1, "4": 1}, [[1, 1], [2, 1], [3, 1], [4, 1]]],
                         ids=["map", "llama-server pairs"])
def test_more_logit_bias_entries_than_the_limit_name_the_flag(bias):
    check_body(json.dumps({"logit_bias": {"1": 1, "2": 1, "3": 1}}).encode(), SIZES)
    err = refused(json.dumps({"logit_bias": bias}).encode(), SIZES)
    assert err.code == "too_many_logit_bias" and err.param == "logit_bias" and "--max-logit-bias" in err.message


def test_error_bodies_are_ascii_even_with_a_surrogate_in_the_message():
    body = ErrorJSONResponse(APIError("bad name '\ud800'").body()).body
    assert json.loads(body)["error"]["message"] == "bad name '\ud800'"


@pytest.mark.parametrize("schema,why", [
    ({"enum": ["a\u0000"]}, "NUL"),
    ({"type": "string", "pattern": "^[\\u0000-\\u001f]$"}, "NUL"),
    ({"enum": []}, "admits no value"),
    ({"type": "string", "pattern": "^[z-a]$"}, "inverted"),
    ({"type": "array", "items": {"type": "integer"}, "maxItems": 5000}, "nests"),
])
def test_grammars_llama_cpp_would_fail_on_are_refused(schema, why):
    with pytest.raises(APIError) as info:
        json_schema_grammar(schema, param="response_format")
    assert why in info.value.message and info.value.code == "invalid_schema"


@pytest.mark.parametrize("schema", [{"type": "string", "pattern": "^[a-z0-9_-]+$"}, {"enum": ["a", "b"]},
                                    {"type": "array", "items": {"type": "integer"}, "maxItems": 500},
                                    {"type": "string", "pattern": "^a\\\\u0000$"}])
def test_ordinary_schemas_still_make_grammars(schema):
    assert "root ::=" in json_schema_grammar(schema, param="response_format")


def test_limits_are_flags_documented_in_help():
    text = build_parser().format_help()
    for flag in ("--max-body-kib", "--max-json-depth", "--max-messages", "--max-tools", "--max-stop",
                 "--max-stop-chars", "--max-tools-kib", "--max-grammar-chars", "--max-schema-kib", "--max-logit-bias",
                 "--max-embeddings-inputs"):
        assert flag in text
    s = settings_from_args(["--max-body-kib", "8", "--max-tools", "0", "--max-stop", "3", "--max-messages", "5",
                            "--max-stop-chars", "64", "--max-tools-kib", "2", "--max-grammar-chars", "100",
                            "--max-schema-kib", "3", "--max-logit-bias", "7", "--max-embeddings-inputs", "9"])
    assert Limits.from_settings(s) == Limits(body_bytes=8192, json_depth=64, messages=5, tools=0, stop=3,
                                             stop_chars=64, tools_bytes=2048, grammar_chars=100, schema_bytes=3072,
                                             logit_bias=7)
    assert s.max_embeddings_inputs == 9
    d = ServerSettings()
    assert (d.max_tools_kib, d.max_grammar_chars, d.max_schema_kib, d.max_logit_bias, d.max_embeddings_inputs) == (
        256, 65536, 64, 1024, 256)
