"""The tool schemas a model request carries, compacted: what the model needs to call them.

Every model step sends the scenario's tools, and the template renders them into the prompt: on
the embedded model's 8K context the story writer's 15 schemas are a real share of it. Compaction
(``ARBOR_COMPACT_TOOL_SCHEMAS``, on by default) leaves out what the model does not read:

- ``"additionalProperties": false`` beside ``properties`` (every `object_schema` has it). llama.cpp
  builds the same grammar without it (an object with ``properties`` and no
  ``additionalProperties`` admits no other keys: common/json-schema.cpp), so a constrained call
  is no looser. Kept where it changes meaning: an object without ``properties`` (it would admit
  any object) and every schema of a ``"strict": true`` function (OpenAI's strict mode needs it).
- JSON Schema's annotations for humans and tools: ``title`` (pydantic adds one to every model and
  field of a LangChain tool), ``$schema``, ``$id``, ``$comment``.
- runs of whitespace in descriptions (collapsed to one space), and a parameter description past
  PARAMETER_DESCRIPTION_CHARS is cut at a word with "…". A tool's own description is never cut:
  it says when to call it.

Only the request changes: arguments are still checked against the tool's full schema
(tools/base.py `run_tool`, app/agent/tool_calls.py), so a call with a key the compacted schema
no longer forbids is refused as before, with its error for the model.

Contract: deterministic and stable: the same schema gives the same dict (keys in their
original order), so the same tools serialise to the same bytes every turn and the server's
prefix cache keeps reusing the prompt that starts with them. Property names, types,
``required``, ``enum``, ``const``, bounds, formats and defaults are never dropped; a property
named like a dropped keyword ("title") is a name, not a keyword, and stays. The input is not
modified.
"""

from __future__ import annotations

import json
from typing import Any

PARAMETER_DESCRIPTION_CHARS = 300
_ANNOTATIONS = frozenset({"title", "$schema", "$id", "$comment"})
# keywords whose value is a schema, a list of schemas, or a map of name -> schema
_SCHEMA = frozenset({"items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames",
                     "unevaluatedItems", "unevaluatedProperties", "additionalItems"})
_SCHEMA_LIST = frozenset({"anyOf", "oneOf", "allOf", "prefixItems"})
_SCHEMA_MAP = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})


def compact_tool(tool: dict) -> dict:
    """One entry of a request's ``tools`` (``{"type": "function", "function": {...}}``) compacted."""
    function = tool.get("function")
    if tool.get("type") != "function" or not isinstance(function, dict):
        return tool  # another kind of tool: sent as it is
    strict = function.get("strict") is True
    out = {}
    for key, value in function.items():
        if key == "description" and isinstance(value, str):
            out[key] = _collapse(value)
        elif key == "parameters" and isinstance(value, dict):
            out[key] = _schema(value, strict, parameter=False)
        else:
            out[key] = value
    return {**tool, "function": out}


def compact_tools(tools: list[dict]) -> list[dict]:
    return [compact_tool(tool) for tool in tools]


def schema_chars(tools: list[dict]) -> int:
    """The tools' size as JSON text, written as a template's ``tojson`` and arbor-server's
    Hermes fallback write it (", " and ": ")."""
    return len(json.dumps(tools, ensure_ascii=False, separators=(", ", ": ")))


def schema_sizes(full: list[dict], sent: list[dict], compacted: bool) -> dict:
    """What a model span records of its tools (app/tracing.py `tool_schema_attributes`)."""
    return {"count": len(sent), "compacted": compacted, "chars": schema_chars(sent), "full_chars": schema_chars(full)}


def _schema(node: Any, strict: bool, parameter: bool) -> Any:
    """A JSON Schema node compacted; `parameter`: it describes one argument (its description may be cut)."""
    if not isinstance(node, dict):
        return node  # true / false schemas
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _ANNOTATIONS:
            continue
        if key == "additionalProperties" and value is False and "properties" in node and not strict:
            continue
        if key == "description" and isinstance(value, str):
            out[key] = _cut(_collapse(value)) if parameter else _collapse(value)
        elif key in _SCHEMA_MAP and isinstance(value, dict):
            # the keys here are names (of properties, definitions): never dropped
            out[key] = {name: _schema(sub, strict, parameter=key == "properties") for name, sub in value.items()}
        elif key in _SCHEMA_LIST and isinstance(value, list):
            out[key] = [_schema(sub, strict, parameter) for sub in value]
        elif key in _SCHEMA:
            out[key] = _schema(value, strict, parameter)
        else:
            out[key] = value  # type, required, enum, const, bounds, format, default, examples, ...
    return out


def _collapse(text: str) -> str:
    return " ".join(text.split())


def _cut(text: str) -> str:
    if len(text) <= PARAMETER_DESCRIPTION_CHARS:
        return text
    head = text[: PARAMETER_DESCRIPTION_CHARS - 1]
    word_end = head.rfind(" ")
    return (head[:word_end] if word_end > PARAMETER_DESCRIPTION_CHARS // 2 else head).rstrip(" ,;:") + "…"
