"""Walking and rewriting expressions: free names, substitution, a bottom-up `rewrite` that the
TL → kernel-IR lowering drives with its own rule, and constant folding."""
from __future__ import annotations

from typing import Callable, Iterator

from tlc.expr.evaluate import C, ExprError, evaluate
from tlc.expr.nodes import BinOp, Call, Const, Expr, Index, Neg, Var


def children(e: Expr) -> tuple[Expr, ...]:
    if isinstance(e, Neg):
        return (e.arg,)
    if isinstance(e, BinOp):
        return (e.lhs, e.rhs)
    if isinstance(e, Call):
        return e.args
    if isinstance(e, Index):
        return (e.base, *e.indices)
    return ()


def subexprs(e: Expr) -> Iterator[Expr]:
    """`e` and every expression inside it, parents first."""
    yield e
    for child in children(e):
        yield from subexprs(child)


def free_names(e: Expr) -> set[str]:
    """The names `e` reads (`_`, a whole mode of a slice, is none)."""
    return {x.name for x in subexprs(e) if isinstance(x, Var) and x.name != "_"}


def rewrite(e: Expr, rule: Callable[[Expr], Expr]) -> Expr:
    """Rebuild `e` bottom-up, applying `rule` to each node once its children are rewritten."""
    if isinstance(e, Neg):
        e = Neg(rewrite(e.arg, rule))
    elif isinstance(e, BinOp):
        e = BinOp(e.op, rewrite(e.lhs, rule), rewrite(e.rhs, rule))
    elif isinstance(e, Call):
        e = Call(e.fn, tuple(rewrite(a, rule) for a in e.args))
    elif isinstance(e, Index):
        base = rewrite(e.base, rule)
        e = Index(base if isinstance(base, Var) else e.base, tuple(rewrite(a, rule) for a in e.indices))
    return rule(e)


def substitute(e: Expr, name: str, value: Expr) -> Expr:
    """`e` with every `Var(name)` replaced by `value` (also inside slices; a slice's base stays)."""
    def rule(x: Expr) -> Expr:
        return value if isinstance(x, Var) and x.name == name else x

    if isinstance(e, Index):
        return Index(e.base, tuple(substitute(a, name, value) for a in e.indices))
    return rewrite(e, rule)


def floor_divisions(e: Expr) -> Expr:
    """`e` with each `/` spelled `floor_div`: a TL expression moved into a loop's stop (where `/` rounds up) keeps
    the floor its `/` means where it was written."""
    return rewrite(e, lambda x: Call("floor_div", (x.lhs, x.rhs)) if isinstance(x, BinOp) and x.op == "/" else x)


# Folding must not change a value that C++ computes differently: `/` and `%` fold only through
# the division functions, whose meaning does not depend on the target.
_FOLDABLE_OPS = ("+", "-", "*", "%")
_FOLDABLE_CALLS = ("ceil_div", "cdiv", "floor_div", "floor_mod", "min", "max")


def fold_node(e: Expr) -> Expr:
    """`e` as one constant when its operands are constants and its value is the same everywhere."""
    if isinstance(e, Neg) and isinstance(e.arg, Const) and not isinstance(e.arg.value, bool):
        return Const(-e.arg.value)
    if isinstance(e, BinOp) and e.op in _FOLDABLE_OPS and isinstance(e.lhs, Const) and isinstance(e.rhs, Const):
        a, b = e.lhs.value, e.rhs.value
        if e.op == "%" and (not isinstance(a, int) or not isinstance(b, int) or a < 0 or b <= 0):
            return e
        return Const(evaluate(e, {}, C))
    if isinstance(e, Call) and e.fn in _FOLDABLE_CALLS and all(isinstance(a, Const) for a in e.args):
        try:
            return Const(evaluate(e, {}, C))
        except ExprError:
            return e
    return e


def fold(e: Expr) -> Expr:
    """Fold constant arithmetic everywhere in `e`, so static extents stay static in the C++."""
    return rewrite(e, fold_node)
