"""tlc/expr/key_window.py: which comparisons bound the keys a row sees, and which are left out and why.
A hypothesis property checks the bounds against the predicate itself, element by element: every key a row
sees under the predicate lies inside [first_key, last_key], and with an exact window the two agree."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tlc.expr import Const, eval_expr, parse_expr
from tlc.expr.key_window import key_window


def test_each_comparison_gives_its_bound() -> None:
    w = key_window(parse_expr("kv_idx > q_idx || kv_idx < q_idx - W"))
    assert w is not None and w.exact
    assert [str(b) for b in w.lower] == ["q_idx - W"] and [str(b) for b in w.upper] == ["q_idx"]
    w = key_window(parse_expr("kv_idx >= q_idx + 2 || q_idx - 3 > kv_idx || kv_idx <= 5"))
    assert w is not None
    assert [str(b) for b in w.upper] == ["q_idx + 2 - 1"]
    assert [str(b) for b in w.lower] == ["q_idx - 3", "5 + 1"]
    assert str(w.first_key(Const(7))) == "max(7 - 3, 5 + 1)" and str(w.last_key(Const(7))) == "7 + 2 - 1"


def test_terms_it_cannot_read_are_left_out_with_the_reason() -> None:
    w = key_window(parse_expr("kv_idx > q_idx || q_idx == 3 || kv_idx > q_idx / 2 || kv_idx < seqlen_k - q_idx"))
    assert w is not None and not w.exact and [str(b) for b in w.upper] == ["q_idx"]
    assert [r.split(": ", 1)[1] for r in w.left_out] == [
        "only comparisons (<, <=, >, >=) of kv_idx with a bound are read",
        "a bound with / or % is not read (it would become part of a loop bound, where / rounds up)",
        "the bound may fall as q_idx grows"]
    assert key_window(parse_expr("kv_idx >= 4 && kv_idx > q_idx")) is None     # && is not read
    assert key_window(parse_expr("kv_idx + 1 > q_idx")) is None                 # kv_idx must stand alone
    assert key_window(parse_expr("kv_idx > 2 * q_idx")) is not None             # still non-decreasing
    assert key_window(parse_expr("kv_idx > -q_idx")) is None


PREDICATES = st.sampled_from([
    "kv_idx > q_idx || kv_idx < q_idx - {a}", "kv_idx >= q_idx + {a} || q_idx - {b} > kv_idx",
    "kv_idx < max(q_idx - {a}, {b}) || kv_idx > min(q_idx + {a}, 20 - {b})", "kv_idx <= {a}",
    "kv_idx > 2 * q_idx - {b} || kv_idx > q_idx + {a}", "kv_idx > q_idx || q_idx == {a}"])


@settings(max_examples=150, deadline=None, database=None, derandomize=True)
@given(template=PREDICATES, a=st.integers(0, 6), b=st.integers(0, 6), q0=st.integers(-4, 20),
       rows=st.integers(1, 6))
def test_the_bounds_hold_for_every_row_of_a_tile(template: str, a: int, b: int, q0: int, rows: int) -> None:
    predicate = parse_expr(template.format(a=a, b=b))
    w = key_window(predicate)
    assert w is not None
    q_last = q0 + rows - 1
    first, last = w.first_key(Const(q0)), w.last_key(Const(q_last))
    lo = -10**9 if first is None else eval_expr(first, {})
    hi = 10**9 if last is None else eval_expr(last, {})
    inner_lo = -10**9 if first is None else eval_expr(w.first_key(Const(q_last)), {})
    inner_hi = 10**9 if last is None else eval_expr(w.last_key(Const(q0)), {})
    for q in range(q0, q_last + 1):
        for kv in range(-5, 40):
            seen = not eval_expr(predicate, {"q_idx": q, "kv_idx": kv})
            if seen:
                assert lo <= kv <= hi, (q, kv)               # outside [lo, hi]: masked for every row
            if w.exact and inner_lo <= kv <= inner_hi:
                assert seen, (q, kv)                          # inside the inner range: seen by every row


def test_a_bound_that_is_not_an_integer_is_left_out() -> None:
    assert key_window(parse_expr("kv_idx < q_idx - 0.5")) is None
    assert key_window(parse_expr("kv_idx < q_idx - scale * 8"), {"scale"}) is None
    w = key_window(parse_expr("kv_idx > q_idx || kv_idx < slopes[head_idx]"), {"slopes"})
    assert w is not None and not w.exact and [str(b) for b in w.upper] == ["q_idx"]
