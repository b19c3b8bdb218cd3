"""tlc.expr.evaluate_tensor (the interpreter's mask predicates) agrees with the host evaluator's TL rules
element by element: integer `/` and `%` floor (negative operands too), a float operand divides exactly,
`cdiv`, `min` and `max` (one float argument gives a float), comparisons, `&&` and `||`; a zero divisor
anywhere in a tensor and a name without a value are errors."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tlc.expr import ExprError, eval_expr, parse_expr
from tlc.expr.evaluate_tensor import evaluate_tensor

NUMBERS = ["q", "k", "3", "-2", "w", "2.5"]


@st.composite
def numbers(draw, depth: int = 2) -> str:
    if depth == 0 or draw(st.booleans()):
        return draw(st.sampled_from(NUMBERS))
    a, b = draw(numbers(depth - 1)), draw(numbers(depth - 1))
    form = draw(st.sampled_from(["({a} + {b})", "({a} - {b})", "({a} * {b})", "({a} / {b})", "({a} % {b})",
                                 "cdiv({a}, {b})", "min({a}, {b})", "max({a}, {b}, 1)", "-{a}"]))
    return form.format(a=a, b=b)


@st.composite
def conditions(draw) -> str:
    parts = [f"{draw(numbers())} {draw(st.sampled_from(['<', '<=', '>', '>=', '==', '!=']))} {draw(numbers())}"
             for _ in range(draw(st.integers(1, 3)))]
    out = parts[0]
    for p in parts[1:]:
        out = f"{out} {draw(st.sampled_from(['&&', '||']))} {p}"
    return out


@settings(max_examples=300, deadline=None, derandomize=True)
@given(text=st.one_of(numbers(), conditions()), w=st.integers(-3, 3))
def test_elementwise_values_are_the_host_evaluators(text: str, w: int) -> None:
    e = parse_expr(text)
    q, k = torch.arange(-4, 5)[:, None], torch.arange(-3, 6)[None, :]
    try:
        got = evaluate_tensor(e, {"q": q, "k": k, "w": w})
    except ExprError:
        got = None
    wants = {}
    for i in range(q.shape[0]):
        for j in range(k.shape[1]):
            try:
                wants[i, j] = eval_expr(e, {"q": int(q[i, 0]), "k": int(k[0, j]), "w": w})
            except (ExprError, ZeroDivisionError):
                assert got is None, text   # a zero divisor at any element is an error for the whole tensor
                return
    assert got is not None, text
    for (i, j), want in wants.items():
        value = got.expand(q.shape[0], k.shape[1])[i, j].item()
        assert value == want or (isinstance(want, float) and abs(value - want) <= 1e-12 * max(1, abs(want))), \
            (text, int(q[i, 0]), int(k[0, j]), value, want)


def test_integer_division_floors_and_modulo_takes_the_divisor_sign() -> None:
    q = torch.tensor([-7, -1, 0, 7])
    assert evaluate_tensor(parse_expr("q / 2"), {"q": q}).tolist() == [-4, -1, 0, 3]
    assert evaluate_tensor(parse_expr("q % 2"), {"q": q}).tolist() == [1, 1, 0, 1]
    assert evaluate_tensor(parse_expr("q % -2"), {"q": q}).tolist() == [-1, -1, 0, -1]
    assert evaluate_tensor(parse_expr("q / 2.0"), {"q": q}).tolist() == [-3.5, -0.5, 0.0, 3.5]


def test_errors() -> None:
    with pytest.raises(ExprError, match="division by zero in 'k / q'"):
        evaluate_tensor(parse_expr("k / q"), {"q": torch.tensor([1, 0]), "k": 1})
    with pytest.raises(ExprError, match="'x' has no value here"):
        evaluate_tensor(parse_expr("x < 1"), {})
