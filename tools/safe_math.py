"""Arithmetic on numbers without eval: + - * / ** and parentheses, nothing else.

The expression is parsed with `ast` and only number literals, the four operations, power,
unary +/- and grouping are walked; names, calls, attributes, subscripts, comparisons and
every other node are refused with `UnsafeExpression`. Arithmetic runs on floats so a huge
power overflows (a readable error) instead of building an enormous integer.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable

MAX_EXPRESSION_LENGTH = 200

_BINARY: dict[type[ast.operator], Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[float], float]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class UnsafeExpression(ValueError):
    """The expression is not plain arithmetic, or cannot be computed; the message says why."""


def evaluate(expression: str) -> float:
    """Return the value of an arithmetic expression such as "(412.3 - 380.1) / 380.1 * 100"."""
    if not isinstance(expression, str) or not expression.strip():
        raise UnsafeExpression("expression is empty")
    if len(expression) > MAX_EXPRESSION_LENGTH:
        raise UnsafeExpression(f"expression is longer than {MAX_EXPRESSION_LENGTH} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise UnsafeExpression(
            f"cannot parse {expression!r}: use numbers, + - * / ** and parentheses"
        ) from None
    try:
        value = _walk(tree.body)
    except ZeroDivisionError:
        raise UnsafeExpression("division by zero") from None
    except OverflowError:
        raise UnsafeExpression("result is too large") from None
    if isinstance(value, complex) or math.isnan(value) or math.isinf(value):
        raise UnsafeExpression("result is not a real number")
    return value


def _walk(node: ast.AST) -> float:
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise UnsafeExpression(f"only numbers are allowed, not {node.value!r}")
        return float(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return _BINARY[type(node.op)](_walk(node.left), _walk(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_walk(node.operand))
    raise UnsafeExpression(
        f"{_node_name(node)} is not allowed: use numbers, + - * / ** and parentheses"
    )


def _node_name(node: ast.AST) -> str:
    names = {
        ast.Name: "a name",
        ast.Call: "a function call",
        ast.Attribute: "an attribute",
        ast.Subscript: "indexing",
        ast.Compare: "a comparison",
        ast.BinOp: "this operator",
        ast.UnaryOp: "this operator",
    }
    return names.get(type(node), f"'{type(node).__name__}'")
