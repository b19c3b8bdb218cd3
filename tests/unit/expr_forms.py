"""The expression the parser builds for a printed one: shared by the expression and IR-parser tests."""
from __future__ import annotations

from tlc.kir.expr import BinOp, Call, Const, Expr, Index, Neg


def parsed_form(e: Expr) -> Expr:
    """What the parser builds for `print_expr(e)`: a minus folds into a number constant."""
    if isinstance(e, Neg):
        arg = parsed_form(e.arg)
        return Const(-arg.value) if isinstance(arg, Const) and not isinstance(arg.value, bool) else Neg(arg)
    if isinstance(e, BinOp):
        return BinOp(e.op, parsed_form(e.lhs), parsed_form(e.rhs))
    if isinstance(e, Call):
        return Call(e.fn, tuple(parsed_form(a) for a in e.args))
    if isinstance(e, Index):
        return Index(e.base, tuple(parsed_form(a) for a in e.indices))
    return e
