"""The calculator tool: arithmetic read by a whitelist over Python's ``ast``, never ``eval``.

Numbers, ``+ - * / // % **``, unary minus and parentheses; ``x``/``×``, ``÷`` and ``^`` are read
as ``*``, ``/`` and ``**``. Bounded: at most ``MAX_CHARS`` characters, ``MAX_NODES`` syntax nodes,
exponents up to ``MAX_EXPONENT`` and results up to ``MAX_ABS``. Anything else is a
``CalculatorError`` whose message the model sees as the tool's answer.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable

MAX_CHARS, MAX_NODES, MAX_EXPONENT, MAX_ABS = 200, 64, 16, 10**15
_BIN: dict[type, Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable[[float], float]] = {ast.USub: operator.neg, ast.UAdd: operator.pos}
_SPELLINGS = {"×": "*", "x": "*", "X": "*", "÷": "/", "^": "**", "−": "-"}


class CalculatorError(ValueError):
    """The expression can't be computed; the message says why."""


def _value(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_value(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BIN:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise CalculatorError(f"exponent {right} is over the limit of {MAX_EXPONENT}")
        try:
            out = _BIN[type(node.op)](left, right)
        except ZeroDivisionError:
            raise CalculatorError("division by zero") from None
        if isinstance(out, complex) or not math.isfinite(out) or abs(out) > MAX_ABS:
            raise CalculatorError(f"the result is out of range (|x| <= {MAX_ABS})")
        return out
    raise CalculatorError(f"unsupported element: {type(node).__name__}; use numbers, + - * / ** and parentheses")


def calculate(expression: str) -> str:
    """The value of ``expression`` as text: an integer when it is whole, else 6 significant digits."""
    if not isinstance(expression, str) or not expression.strip():
        raise CalculatorError("expression is empty: pass the arithmetic to compute, e.g. '12 * (3 + 4)'")
    if len(expression) > MAX_CHARS:
        raise CalculatorError(f"expression has {len(expression)} characters, over the limit of {MAX_CHARS}")
    text = "".join(_SPELLINGS.get(ch, ch) for ch in expression.replace(",", "")).strip().rstrip("=").strip()
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as err:
        raise CalculatorError(f"not an arithmetic expression: {getattr(err, 'msg', err)}") from None
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        raise CalculatorError(f"expression is too long (over {MAX_NODES} elements)")
    out = _value(tree.body)
    if isinstance(out, float) and out.is_integer():
        return str(int(out))
    return str(out) if isinstance(out, int) else f"{out:.6g}"
