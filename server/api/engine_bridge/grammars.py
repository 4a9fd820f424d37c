"""GBNF grammars for structured output, via llama-cpp-python's JSON-schema converter (the same
one llama.cpp ships as json_schema_to_grammar.py), and the checks every grammar passes before it
reaches the engine (tool-call grammars come from llama.cpp's chat layer: tool_grammar).

Every grammar made from a client's schema is parsed by llama.cpp here, in the API, when
the caller passes the vocabulary: a schema the converter turns into a broken grammar is a
400 naming the parameter, never a failure inside the engine (a 500)."""

from __future__ import annotations

import json
import re
from typing import Any

import llama_cpp
from llama_cpp.llama_grammar import SchemaConverter

from server.api.http.errors import invalid

# An escape for code point 0 in GBNF (\x00, \u0000, \U00000000) not itself escaped. llama.cpp
# ends its code point arrays with 0, so a grammar that can match code point 0 can accept a token
# into a dead end, and llama.cpp then aborts the whole process ("Unexpected empty grammar stack").
_CODEPOINT_ZERO = re.compile(r"(?<!\\)(?:\\\\)*\\(?:x0{2}|u0{4}|U0{8})")
# A negated character class, whose members are what it excludes.
_NEGATED_CLASS = re.compile(r"\[\^(?:\\.|[^\]\\])*\]")
# A rule with nothing to match (the converter writes `root ::= ` for an empty enum or oneOf).
_EMPTY_RULE = re.compile(r"^\S+ ::= *$", re.MULTILINE)
# Literals and character classes, whose brackets do not nest.
_LITERALS = re.compile(r'"(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\]')
# One character of a character class: an escape or a plain character.
_CLASS_CHAR = re.compile(r"\\x[0-9a-fA-F]{2}|\\u[0-9a-fA-F]{4}|\\U[0-9a-fA-F]{8}|\\.|.", re.DOTALL)
_ESCAPES = {"n": 10, "r": 13, "t": 9}
# llama.cpp parses grammars by recursive descent, one C stack frame per parenthesis: the
# converter writes maxItems/maxLength n as n nested groups, and n = 100000 overflowed the stack
# and killed the server. 1000 levels stay far inside the default thread stack.
MAX_GRAMMAR_NESTING = 1000

# Any JSON object, for response_format json_object.
_ANY_OBJECT_SCHEMA: dict[str, Any] = {"type": "object"}


def _converter(prop_order: dict[str, int] | None = None) -> SchemaConverter:
    return SchemaConverter(prop_order=prop_order or {}, allow_fetch=False, dotall=False, raw_pattern=False)


def json_schema_grammar(schema: dict[str, Any], *, param: str, vocab=None) -> str:
    """Grammar whose root is a JSON value valid against `schema`; 400 if the schema is unusable
    (with `vocab`, also when llama.cpp cannot parse the grammar the converter made)."""
    _check_patterns(schema, param)
    conv = _converter()
    try:
        resolved = conv.resolve_refs(json.loads(json.dumps(schema)), "request")
        conv.visit(resolved, "")
        grammar = conv.format_grammar()
    except Exception as exc:  # the converter raises bare errors on unsupported schemas
        raise invalid(f"{param}: unsupported JSON schema ({exc})", param=param) from exc
    return _parsed(_checked(grammar, param), vocab, param, what="the grammar made from this JSON schema")


def _check_patterns(schema: Any, param: str) -> None:
    """Refuse a `pattern` the converter would turn into a broken grammar. It takes a pattern
    as `^...$` and drops both anchors; when the text before the `$` ends with a lone
    backslash (`^a\\$`: in a regex, an escaped dollar and no end anchor) the backslash is
    left dangling and escapes the grammar literal's closing quote."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            pattern = node.get("pattern")
            if isinstance(pattern, str):
                body = pattern[:-1] if pattern.endswith("$") else pattern
                if (len(body) - len(body.rstrip("\\"))) % 2 == 1:
                    raise invalid(f"{param}: the pattern \"{pattern}\" ends with a lone backslash (an unfinished "
                                  "escape); write \\\\ for a literal backslash, and end an anchored pattern with "
                                  "an unescaped $", param=param, code="invalid_schema")
            stack.extend(v for v in node.values() if not isinstance(v, str))


def _parsed(grammar: str, vocab, param: str, *, what: str) -> str:
    """`grammar`, if llama.cpp's grammar sampler accepts it (parses, has a `root` rule, no
    left recursion; skipped without a vocabulary), else a 400 naming `param`. The check
    builds the sampler once and frees it: the code that will constrain sampling decides."""
    if vocab is None:
        return grammar
    sampler = llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
    if not sampler:
        raise invalid(f"{param}: llama.cpp could not parse {what} (a syntax error, an undefined rule, no 'root' "
                      "rule, or left recursion)", param=param,
                      code="invalid_grammar" if param == "grammar" else "invalid_schema")
    llama_cpp.llama_sampler_free(sampler)
    return grammar


def _checked(grammar: str, param: str) -> str:
    """The grammar, if llama.cpp can take it without failing or crashing; else 400 naming why."""
    # a NUL inside a negated class ([^...\x00-\x1F], llama.cpp's own JSON string rule) excludes it
    if "\x00" in grammar or _CODEPOINT_ZERO.search(_NEGATED_CLASS.sub("", grammar)):
        raise invalid(f"{param}: the JSON schema has a NUL character (\\u0000) in a name, value or pattern, "
                      "which constrained generation cannot produce", param=param, code="invalid_schema")
    if _EMPTY_RULE.search(grammar):
        raise invalid(f"{param}: the JSON schema admits no value at all (an empty enum, oneOf or anyOf?)",
                      param=param, code="invalid_schema")
    if _has_inverted_range(grammar):
        # A class like [z-a] matches nothing: generation reaches a state no token satisfies, and
        # llama.cpp aborts the process instead of failing the request.
        raise invalid(f"{param}: the JSON schema has a pattern with an inverted character range (like [z-a])",
                      param=param, code="invalid_schema")
    depth = _nesting(_LITERALS.sub("", grammar))
    if depth > MAX_GRAMMAR_NESTING:
        raise invalid(f"{param}: the JSON schema is too large to enforce: its grammar nests {depth} levels, more "
                      f"than {MAX_GRAMMAR_NESTING} (a large maxItems, maxLength or pattern repetition?)",
                      param=param, code="invalid_schema")
    return grammar


def _has_inverted_range(grammar: str) -> bool:
    for match in _LITERALS.finditer(grammar):
        if not match.group().startswith("["):
            continue
        chars = _CLASS_CHAR.findall(match.group()[1:-1].removeprefix("^"))
        for i in range(len(chars) - 2):
            if chars[i + 1] == "-" and _codepoint(chars[i]) > _codepoint(chars[i + 2]):
                return True
    return False


def _codepoint(char: str) -> int:
    if len(char) == 1:
        return ord(char)
    if char[1] in "xuU" and len(char) > 2:
        return int(char[2:], 16)
    return _ESCAPES.get(char[1], ord(char[1]))


def _nesting(text: str) -> int:
    depth = deepest = 0
    for ch in text:
        if ch == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif ch == ")":
            depth -= 1
    return deepest


def json_object_grammar() -> str:
    return json_schema_grammar(_ANY_OBJECT_SCHEMA, param="response_format")


# The free text llama.cpp's forced-tool-call grammars allow before the call: an optional
# `until-N` rule right before the root's tool-call(s) (reasoning is a rule of its own, kept).
_TEXT_BEFORE_CALL = re.compile(r"[ \t]+until-\d+\?(?=[ \t]+tool-calls?\b)")
# Its sequence of call blocks, one or more.
_CALL_BLOCKS = re.compile(r"^tool-calls ::= \(tool-call space\)\+$")


def forced_call_grammar(grammar: str, *, parallel: bool) -> str:
    """A forced tool call's grammar as OpenAI means `required`: call now, once unless parallel,
    then end. llama.cpp's grammar lets the reply say anything first and then write any number of
    call blocks, each followed by whitespace; a small model spends its max_tokens talking,
    repeats its call until max_tokens cuts one in half, or pads with whitespace. Only those two
    rules change (reasoning stays allowed); a grammar of another shape is returned as it is."""
    lines = grammar.split("\n")
    for i, line in enumerate(lines):
        if line.startswith("root ::= "):
            lines[i] = _TEXT_BEFORE_CALL.sub("", line)
        elif _CALL_BLOCKS.match(line):
            # nothing after the last block either: its trailing whitespace rule lets a small model
            # pad the reply with tabs until max_tokens instead of ending it
            lines[i] = "tool-calls ::= tool-call (space tool-call)*" if parallel else "tool-calls ::= tool-call"
    return "\n".join(lines)


def tool_grammar(grammar: str, vocab) -> str:
    """The grammar llama.cpp's chat layer made from the request's tools, checked as a client's
    schema is: a parameter schema it turns into a grammar llama.cpp would fail or crash on is a
    400 naming `tools`, never a failure inside the engine."""
    return _parsed(_checked(grammar, "tools"), vocab, "tools",
                   what="the grammar made from the tools' parameter schemas")


def checked_gbnf(grammar: str, vocab, *, param: str = "grammar") -> str:
    """`grammar` if llama.cpp's grammar sampler accepts it (parses, has a `root` rule, no
    left recursion), else a 400. The check builds the sampler once and frees it: the same
    code that will constrain sampling decides, so nothing valid is refused and nothing
    invalid reaches the engine."""
    _checked(grammar, param)  # shapes that would make llama.cpp abort the process, not just fail
    return _parsed(grammar, vocab, param, what="this GBNF grammar")


def requested_grammar(grammar: str | None, json_schema: dict[str, Any] | None, vocab) -> str | None:
    """The constraint of llama-server's `grammar` / `json_schema` fields (at most one), or None."""
    if grammar and json_schema is not None:
        raise invalid("give either grammar or json_schema, not both", param="grammar")
    if grammar:
        return checked_gbnf(grammar, vocab)
    if json_schema is not None:
        return json_schema_grammar(json_schema, param="json_schema", vocab=vocab)
    return None
