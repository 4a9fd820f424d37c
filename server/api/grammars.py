"""GBNF grammars for forced tool calls and structured output, via llama-cpp-python's
JSON-schema converter (the same one llama.cpp ships as json_schema_to_grammar.py)."""

from __future__ import annotations

import json
from typing import Any

import llama_cpp
from llama_cpp.llama_grammar import SchemaConverter

from server.api.errors import invalid

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"

# Any JSON object, for response_format json_object.
_ANY_OBJECT_SCHEMA: dict[str, Any] = {"type": "object"}


def _converter(prop_order: dict[str, int] | None = None) -> SchemaConverter:
    return SchemaConverter(prop_order=prop_order or {}, allow_fetch=False, dotall=False, raw_pattern=False)


def json_schema_grammar(schema: dict[str, Any], *, param: str) -> str:
    """Grammar whose root is a JSON value valid against `schema`; 400 if the schema is unusable."""
    conv = _converter()
    try:
        resolved = conv.resolve_refs(json.loads(json.dumps(schema)), "request")
        conv.visit(resolved, "")
        return conv.format_grammar()
    except Exception as exc:  # the converter raises bare errors on unsupported schemas
        raise invalid(f"{param}: unsupported JSON schema ({exc})", param=param) from exc


def json_object_grammar() -> str:
    return json_schema_grammar(_ANY_OBJECT_SCHEMA, param="response_format")


def tool_call_grammar(functions: list[dict[str, Any]], *, allow_many: bool) -> str:
    """Grammar for one (or, with allow_many, one or more) Hermes-style tool calls:

        <tool_call>
        {"name": "<one of the functions>", "arguments": {...valid against its parameters}}
        </tool_call>
    """
    if not functions:
        raise invalid("no tools to call", param="tools")
    alternatives = [
        {
            "type": "object",
            "properties": {"name": {"const": f["name"]}, "arguments": f.get("parameters") or {"type": "object"}},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for f in functions
    ]
    schema = alternatives[0] if len(alternatives) == 1 else {"oneOf": alternatives}
    conv = _converter({"name": 0, "arguments": 1})
    try:
        resolved = conv.resolve_refs(json.loads(json.dumps(schema)), "tools")
        conv.visit(resolved, "call")
        body = conv.format_grammar()
    except Exception as exc:
        raise invalid(f"tools: a function's parameters are not a usable JSON schema ({exc})", param="tools") from exc
    one = f'"{TOOL_CALL_OPEN}\\n" call "\\n{TOOL_CALL_CLOSE}"'
    root = f"root ::= {one} (\"\\n\" {one})*" if allow_many else f"root ::= {one}"
    return root + "\n" + body


def checked_gbnf(grammar: str, vocab, *, param: str = "grammar") -> str:
    """`grammar` if llama.cpp's grammar sampler accepts it (parses, has a `root` rule, no
    left recursion), else a 400. The check builds the sampler once and frees it: the same
    code that will constrain sampling decides, so nothing valid is refused and nothing
    invalid reaches the engine."""
    sampler = llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
    if not sampler:
        raise invalid(f"{param}: llama.cpp could not parse this GBNF grammar (a syntax error, an undefined rule, "
                      f"no 'root' rule, or left recursion)", param=param, code="invalid_grammar")
    llama_cpp.llama_sampler_free(sampler)
    return grammar


def requested_grammar(grammar: str | None, json_schema: dict[str, Any] | None, vocab) -> str | None:
    """The constraint of llama-server's `grammar` / `json_schema` fields (at most one), or None."""
    if grammar and json_schema is not None:
        raise invalid("give either grammar or json_schema, not both", param="grammar")
    if grammar:
        return checked_gbnf(grammar, vocab)
    if json_schema is not None:
        return json_schema_grammar(json_schema, param="json_schema")
    return None
