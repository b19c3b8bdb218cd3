"""Mask predicates (`Compute Mask S where kv_idx < q_idx - Window`): which expressions are conditions, and
why an operator is given a condition where it takes a number or the other way round.

A predicate is a condition: a comparison (`<`, `<=`, `>`, `>=`, `==`, `!=`) of numbers, or conditions
joined by `&&` and `||`. The TL parser allows these operators only in a predicate and checks each one
with `operand_problem` as it builds it, so a mistake is reported at the operator's column.
"""
from __future__ import annotations

from tlc.expr import BinOp, Expr

COMPARISONS = ("<", "<=", ">", ">=", "==", "!=")
CONNECTIVES = ("&&", "||")


def is_condition(e: Expr) -> bool:
    """A comparison or a `&&` / `||` of conditions (the parser builds nothing else that is true or false)."""
    return isinstance(e, BinOp) and e.op in COMPARISONS + CONNECTIVES


def operand_problem(op: str, operands: tuple[Expr, ...]) -> str | None:
    """Why `op` (an operator, `-` in front, or a function's name) cannot take `operands`, or None."""
    if op in CONNECTIVES:
        number = next((x for x in operands if not is_condition(x)), None)
        if number is not None:
            return f"'{op}' joins conditions, but '{number}' is a number; compare it, e.g. '{number} != 0'"
        return None
    condition = next((x for x in operands if is_condition(x)), None)
    if condition is None:
        return None
    assert isinstance(condition, BinOp)
    chained = condition is operands[0] and condition.op in COMPARISONS and not is_condition(operands[-1])
    if op in COMPARISONS and chained:   # `a < b < c`
        return (f"comparisons do not chain: write '{condition} && {condition.rhs} {op} {operands[-1]}' "
                f"instead of '{condition} {op} {operands[-1]}'")
    if op in COMPARISONS:
        return f"'{op}' compares numbers, but '{condition}' is a condition; join conditions with && and ||"
    return f"'{op}' takes numbers, but '{condition}' is a condition (true or false)"


def predicate_problem(e: Expr) -> str | None:
    """Why `e` cannot be a mask predicate (it must be a condition), or None."""
    if is_condition(e):
        return None
    return (f"a mask predicate is a condition, true where a score is masked: a comparison (<, <=, >, >=, ==, !=) "
            f"or comparisons joined by && and ||; '{e}' is a number")
