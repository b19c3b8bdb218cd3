"""Which keys a predicate mask leaves a query row, as bounds the `mask` pass can place tiles with.

A predicate mask is true where a score is masked. When it is a disjunction (`||`) of comparisons
between `kv_idx` and a bound that does not fall as `q_idx` grows,

    kv_idx > q_idx || kv_idx < q_idx - Window          (a causal sliding window)

row q sees exactly the keys `lo(q) <= kv_idx <= hi(q)`, where `lo` is the largest lower bound
(`kv_idx < e` gives e, `kv_idx <= e` gives e + 1) and `hi` the smallest upper one (`kv_idx > e` gives
e, `kv_idx >= e` gives e - 1). Both are non-decreasing in q, so over the rows q0 … q_last of a query
tile the keys any row sees lie in [lo(q0), hi(q_last)] and the keys every row sees contain
[lo(q_last), hi(q0)]: a key tile outside the first is empty (every score masked), one inside the
second is full (none masked), any other is partial.

A comparison the analysis cannot read (`!=`, `&&`, a bound with `/` or `%`, one that falls as `q_idx`
grows, one that reads no `kv_idx`) is left out of the bounds: leaving out a masked term only widens
what a row sees, so the empty tiles stay empty, but a tile that looks full may not be, and
`KeyWindow.exact` is False (the mask then stays in every trip that is not empty).

`/` and `%` are refused in bounds because the derived loop stop is a loop bound, where TL's `/` rounds
up (LANGUAGE.md §4): a bound copied there would change its meaning.
"""
from __future__ import annotations

from dataclasses import dataclass

from tlc.expr import BinOp, Call, Const, Expr, Index, Neg, Var
from tlc.expr.rewrite import subexprs, substitute

QUERY, KEY = "q_idx", "kv_idx"
_FLIPPED = {"<": ">", "<=": ">=", ">": "<", ">=": "<="}


@dataclass(frozen=True)
class KeyWindow:
    """Row q sees the keys max(lower)(q) <= kv_idx <= min(upper)(q) (an empty tuple: no bound)."""

    lower: tuple[Expr, ...]
    upper: tuple[Expr, ...]
    exact: bool                       # every masked term is one of the bounds
    left_out: tuple[str, ...] = ()    # why each other term was not read

    def first_key(self, q: Expr) -> Expr | None:
        """The smallest key row `q` may see (None: no lower bound)."""
        return _extreme("max", self.lower, q)

    def last_key(self, q: Expr) -> Expr | None:
        """The largest key row `q` may see (None: no upper bound)."""
        return _extreme("min", self.upper, q)


def _extreme(fn: str, bounds: tuple[Expr, ...], q: Expr) -> Expr | None:
    if not bounds:
        return None
    at = [substitute(b, QUERY, q) for b in bounds]
    return at[0] if len(at) == 1 else Call(fn, tuple(at))


def key_window(predicate: Expr, floats: frozenset[str] | set[str] = frozenset()) -> KeyWindow | None:
    """The keys each row sees, or None when no term of the predicate bounds them. `floats`: the names whose
    values are not integers (float Inputs and Params, fp32 tensors): a bound reading one is not read."""
    lower: list[Expr] = []
    upper: list[Expr] = []
    left_out: list[str] = []
    for term in _terms(predicate):
        bound = _bound(term, floats)
        if isinstance(bound, str):
            left_out.append(f"'{term}': {bound}")
        elif bound[0] == "lower":
            lower.append(bound[1])
        else:
            upper.append(bound[1])
    if not lower and not upper:
        return None
    return KeyWindow(tuple(lower), tuple(upper), not left_out, tuple(left_out))


def unread_terms(predicate: Expr, floats: frozenset[str] | set[str] = frozenset()) -> list[str]:
    """Each term of the predicate that bounds no key, with the reason."""
    return [f"'{t}': {b}" for t in _terms(predicate) if isinstance(b := _bound(t, floats), str)]


def _terms(e: Expr) -> list[Expr]:
    if isinstance(e, BinOp) and e.op == "||":
        return _terms(e.lhs) + _terms(e.rhs)
    return [e]


def _bound(term: Expr, floats: frozenset[str] | set[str] = frozenset()) -> tuple[str, Expr] | str:
    """("lower", e): the term masks kv_idx < e; ("upper", e): it masks kv_idx > e; else why not."""
    if not (isinstance(term, BinOp) and term.op in _FLIPPED):
        return "only comparisons (<, <=, >, >=) of kv_idx with a bound are read"
    op, lhs, rhs = term.op, term.lhs, term.rhs
    if rhs == Var(KEY) and lhs != Var(KEY):
        op, lhs, rhs = _FLIPPED[op], rhs, lhs
    if lhs != Var(KEY):
        return "one side must be kv_idx itself"
    why = _not_a_bound(rhs, floats)
    if why:
        return why
    if op == "<":
        return "lower", rhs
    if op == "<=":
        return "lower", BinOp("+", rhs, Const(1))
    if op == ">":
        return "upper", rhs
    return "upper", BinOp("-", rhs, Const(1))


def _not_a_bound(e: Expr, floats: frozenset[str] | set[str] = frozenset()) -> str | None:
    """Why `e` cannot bound kv_idx: it reads kv_idx, divides, is not an integer, or may fall as q_idx grows."""
    for x in subexprs(e):
        if x == Var(KEY):
            return "the bound reads kv_idx"
        if isinstance(x, BinOp) and x.op in ("/", "%"):
            return "a bound with / or % is not read (it would become part of a loop bound, where / rounds up)"
        if isinstance(x, Const) and isinstance(x.value, float) or isinstance(x, Var) and x.name in floats or \
                isinstance(x, Index) and x.base.name in floats:
            return "a bound that is not an integer is not read (tiles are counted in whole keys)"
    if _slope(e) is None:
        return "the bound may fall as q_idx grows"
    return None


def _slope(e: Expr) -> str | None:
    """'flat' (no q_idx), 'up' (non-decreasing in q_idx), or None (may fall, or not known)."""
    if isinstance(e, Const):
        return "flat"
    if isinstance(e, Var):
        return "up" if e.name == QUERY else "flat"
    if isinstance(e, Neg):
        return "flat" if _slope(e.arg) == "flat" else None
    if isinstance(e, BinOp):
        a, b = _slope(e.lhs), _slope(e.rhs)
        if a is None or b is None:
            return None
        if e.op == "+":
            return "flat" if a == b == "flat" else "up"
        if e.op == "-":
            return a if b == "flat" else None
        if e.op == "*":
            if a == b == "flat":
                return "flat"
            factor = e.rhs if a == "up" else e.lhs
            return "up" if b != a and isinstance(factor, Const) and factor.value >= 0 else None
        return None if "up" in (a, b) else "flat"   # comparisons and the like: constant only without q_idx
    if isinstance(e, Index):   # a tensor Input's element: the same for every row when no index reads q_idx
        return "flat" if all(_slope(i) == "flat" for i in e.indices) else None
    if isinstance(e, Call):
        slopes = [_slope(a) for a in e.args]
        if None in slopes:
            return None
        if all(s == "flat" for s in slopes):
            return "flat"
        return "up" if e.fn in ("min", "max") else None
    return None
