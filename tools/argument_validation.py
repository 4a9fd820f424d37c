"""Validate tool-call arguments with `jsonschema`, in the workbench's own words.

The checking is the field's library (`jsonschema`, JSON Schema 2020-12): whatever keyword a
tool's schema uses is enforced as the standard says. The *messages* are ours: a small model
(and its operator) must be able to act on them, so every problem is reported at once, one
plain sentence each, naming the argument (``'tags[1]' must be a string, got the number 1``)
and, for an unknown key, the accepted ones. A keyword we have no sentence for falls back to
the library's own message after the argument's name.

Contract: `validate_arguments(schema, arguments)` returns a normalised copy (integral floats
such as 5.0 become int 5 for `integer` fields, as JSON Schema counts them integers) or
raises `ArgumentProblems` whose `problems` list holds one readable sentence per fault.
Unknown keys are always rejected, whatever `additionalProperties` says. `check_schema`
rejects a tool definition whose schema is not valid JSON Schema.
"""

from __future__ import annotations

from typing import Any, cast

from jsonschema import Draft202012Validator, ValidationError
from jsonschema.exceptions import SchemaError

_TYPE_NAMES = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "array": "a list",
    "object": "an object",
    "null": "null",
}


class ArgumentProblems(ValueError):
    """Raised with every problem found; str() joins them into one message."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("; ".join(problems))


def check_schema(schema: dict) -> None:
    """ValueError naming the fault when `schema` is not a valid JSON Schema."""
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        raise ValueError(f"not a valid JSON Schema: {exc.message}") from None


def validate_arguments(schema: dict, arguments: Any) -> dict:
    """Check `arguments` against an object `schema`; return the normalised arguments."""
    if not isinstance(arguments, dict):
        raise ArgumentProblems([f"arguments must be a JSON object, got {_describe(arguments)}"])
    strict = {**schema, "additionalProperties": False}  # unknown keys: always a problem
    errors = sorted(Draft202012Validator(strict).iter_errors(arguments), key=lambda e: _order(e, arguments))
    problems: list[str] = []
    for error in errors:
        for problem in _sentences(error, schema, arguments):
            if problem not in problems:
                problems.append(problem)
    if problems:
        raise ArgumentProblems(problems)
    properties = schema.get("properties", {})
    return {key: _normalise(properties[key], value) for key, value in arguments.items()}


def _order(error: ValidationError, arguments: dict) -> tuple:
    """Missing keys first, then in the order the model gave the arguments."""
    if not error.path:
        return (0, 0, error.validator)
    keys = list(arguments)
    top = error.path[0]
    return (1, keys.index(top) if top in keys else len(keys), [str(p) for p in error.path])


def _name(path: Any) -> str:
    name = ""
    for part in path:
        name += f"[{part}]" if isinstance(part, int) else (f".{part}" if name else str(part))
    return name


def _sentences(error: ValidationError, schema: dict, arguments: dict) -> list[str]:
    # the schema's value for the failed keyword: a list, a number or a type name, by keyword
    kind, expected, value = error.validator, cast(Any, error.validator_value), error.instance
    if kind == "required" and not error.path:
        return [f"'{key}' is required" for key in expected if key not in arguments]
    if kind == "additionalProperties" and not error.path:
        properties = schema.get("properties", {})
        accepted = ", ".join(properties) or "none"
        return [f"'{key}' is not an accepted argument (accepted: {accepted})"
                for key in arguments if key not in properties]
    name = _name(error.path) or "arguments"
    if kind == "type":
        types: list[str] = expected if isinstance(expected, list) else [expected]
        wanted = " or ".join(_TYPE_NAMES.get(t, t) for t in types)
        return [f"'{name}' must be {wanted}, got {_describe(value)}"]
    if kind == "enum":
        return [f"'{name}' must be one of {', '.join(str(c) for c in expected)} (got {value!r})"]
    if kind in ("minimum", "exclusiveMinimum"):
        return [f"'{name}' must be {'at least' if kind == 'minimum' else 'more than'} {expected} (got {value})"]
    if kind in ("maximum", "exclusiveMaximum"):
        return [f"'{name}' must be {'at most' if kind == 'maximum' else 'less than'} {expected} (got {value})"]
    if kind == "minLength":
        return [f"'{name}' must have at least {expected} characters"]
    if kind == "maxLength":
        return [f"'{name}' must have at most {expected} characters"]
    if kind == "minItems":
        return [f"'{name}' must have at least {expected} items"]
    if kind == "maxItems":
        return [f"'{name}' must have at most {expected} items"]
    if kind == "required":  # inside a nested object
        return [f"'{name}.{key}' is required" for key in expected if isinstance(value, dict) and key not in value]
    return [f"'{name}': {error.message}"]


def _normalise(schema: dict, value: Any) -> Any:
    """Integral floats of `integer` fields (and list items) as int; everything else as given."""
    types = schema.get("type")
    types = types if isinstance(types, list) else [types]
    if isinstance(value, float) and value.is_integer() and "integer" in types and "number" not in types:
        return int(value)
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [_normalise(schema["items"], item) for item in value]
    return value


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return f"the string {shown!r}"
    if isinstance(value, (int, float)):
        return f"the number {value}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__
