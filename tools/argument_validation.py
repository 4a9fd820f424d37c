"""Validate tool-call arguments against the small JSON Schema subset our tools declare.

Why our own: the tool schemas use only `type: object` with `properties`, `required`,
`enum`, `minimum`/`maximum`, `minLength`/`maxLength` and `items`, and the workbench needs
messages a small model (and its operator) can act on: every problem at once, in plain
words, naming the accepted arguments. A full JSON Schema engine would add a dependency and
produce path-heavy messages for a subset this small.

Contract: `validate_arguments(schema, arguments)` returns a normalised copy (integral floats
such as 5.0 become int 5 for `integer` fields, as JSON Schema counts them integers) or
raises `ArgumentProblems` whose `problems` list holds one readable sentence per fault.
Unknown keys are always rejected, whatever `additionalProperties` says.
"""

from __future__ import annotations

from typing import Any

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


def validate_arguments(schema: dict, arguments: Any) -> dict:
    """Check `arguments` against an object `schema`; return the normalised arguments."""
    if not isinstance(arguments, dict):
        raise ArgumentProblems([f"arguments must be a JSON object, got {_describe(arguments)}"])
    properties: dict = schema.get("properties", {})
    problems: list[str] = []
    normalised: dict = {}

    for key in schema.get("required", []):
        if key not in arguments:
            problems.append(f"'{key}' is required")

    for key, value in arguments.items():
        if key not in properties:
            accepted = ", ".join(properties) or "none"
            problems.append(f"'{key}' is not an accepted argument (accepted: {accepted})")
            continue
        value, value_problems = _check_value(key, properties[key], value)
        problems.extend(value_problems)
        normalised[key] = value

    if problems:
        raise ArgumentProblems(problems)
    return normalised


def _check_value(name: str, schema: dict, value: Any) -> tuple[Any, list[str]]:
    expected = schema.get("type")
    if expected is not None:
        types = expected if isinstance(expected, list) else [expected]
        matched = next((t for t in types if _is_type(value, t)), None)
        if matched is None:
            wanted = " or ".join(_TYPE_NAMES.get(t, t) for t in types)
            return value, [f"'{name}' must be {wanted}, got {_describe(value)}"]
        if matched == "integer" and isinstance(value, float):
            value = int(value)

    problems: list[str] = []
    if "enum" in schema and value not in schema["enum"]:
        choices = ", ".join(str(c) for c in schema["enum"])
        problems.append(f"'{name}' must be one of {choices} (got {value!r})")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            problems.append(f"'{name}' must be at least {schema['minimum']} (got {value})")
        if "maximum" in schema and value > schema["maximum"]:
            problems.append(f"'{name}' must be at most {schema['maximum']} (got {value})")
    if isinstance(value, str):
        if "minLength" in schema and len(value) < schema["minLength"]:
            problems.append(f"'{name}' must have at least {schema['minLength']} characters")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            problems.append(f"'{name}' must have at most {schema['maxLength']} characters")
    if isinstance(value, list) and "items" in schema:
        checked = []
        for index, item in enumerate(value):
            item, item_problems = _check_value(f"{name}[{index}]", schema["items"], item)
            problems.extend(item_problems)
            checked.append(item)
        value = checked
    return value, problems


def _is_type(value: Any, type_name: str) -> bool:
    # bool is a subclass of int in Python but not a number in JSON.
    if type_name == "string":
        return isinstance(value, str)
    if type_name == "integer":
        if isinstance(value, bool):
            return False
        return isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if type_name == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if type_name == "boolean":
        return isinstance(value, bool)
    if type_name == "array":
        return isinstance(value, list)
    if type_name == "object":
        return isinstance(value, dict)
    if type_name == "null":
        return value is None
    raise ValueError(f"unsupported schema type {type_name!r}")


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
