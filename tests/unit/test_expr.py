"""The one expression language (`tlc.expr`): print → parse round trips through every text form,
the evaluators agree across the TL → kernel-IR lowering, and the TL graph and the kernel IR hold
the very same node classes."""
from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tlc.expr as X
from tests.unit.expr_forms import parsed_form
from tlc.diagnostics import TlcError
from tlc.expr import (ARITHMETIC, BINOPS, FUNCTIONS, BinOp, Call, Const, Expr, ExprError, Index, Neg, Var, eval_expr,
                      evaluate, fold, free_names, parse_expr, print_expr, substitute)
from tlc.frontend import ast as A
from tlc.frontend.parser import parse_text
from tlc.ir.irparser import parse_attr
from tlc.kir import evaluate as kir_evaluate
from tlc.kir import expr as K
from tlc.lowering.exprs import ExprLowering

NODE_CLASSES = (Const, Var, BinOp, Neg, Call, Index)

# ------------------------------------------------------------------ strategies


def _calls(sub: st.SearchStrategy[Expr], names: list[str]) -> st.SearchStrategy[Expr]:
    def args(fn: str) -> st.SearchStrategy[Expr]:
        least, most = FUNCTIONS[fn]
        return st.lists(sub, min_size=least, max_size=most or least + 2).map(lambda a: Call(fn, tuple(a)))

    return st.sampled_from(names).flatmap(args)


# Every node kind, every operator and function, dotted names, `_`, bools, infinities.
_any_leaf = st.one_of(
    st.sampled_from(["n", "BM", "p.seqlen_k", "threadIdx.x", "_", "tSrS"]).map(Var),
    st.one_of(st.integers(-(10**6), 10**6), st.booleans(), st.just(math.inf), st.just(-math.inf),
              st.floats(allow_nan=False, allow_infinity=False, min_value=-1e20, max_value=1e20)).map(Const))
ANY = st.recursive(_any_leaf, lambda sub: st.one_of(
    st.builds(BinOp, st.sampled_from(sorted(BINOPS)), sub, sub), sub.map(Neg), _calls(sub, sorted(FUNCTIONS)),
    st.tuples(st.sampled_from(["sK", "tSrS"]).map(Var), st.lists(sub, min_size=1, max_size=3)).map(
        lambda t: Index(t[0], tuple(t[1])))), max_leaves=20)

# The TL subset: what a `.tl` program may write.
_tl_leaf = st.one_of(st.sampled_from(["n", "BM", "seqlen_k", "head_idx"]).map(Var),
                     st.integers(0, 10**4).map(Const), st.floats(0.0, 1e4, allow_nan=False).map(Const))
TL_EXPRS = st.recursive(_tl_leaf, lambda sub: st.one_of(
    st.builds(BinOp, st.sampled_from(ARITHMETIC), sub, sub), sub.map(Neg), _calls(sub, list(A.TL_FUNCTIONS))),
    max_leaves=12)

_SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ------------------------------------------------------------------ round trips


@_SETTINGS
@given(ANY)
def test_print_parse_round_trip_of_every_node_kind(e: Expr) -> None:
    text = print_expr(e)
    assert parse_expr(text) == parsed_form(e)
    assert print_expr(parse_expr(text)) == print_expr(parsed_form(e))


@_SETTINGS
@given(TL_EXPRS)
def test_a_tl_expression_reads_the_same_in_a_program_in_the_tl_graph_text_and_alone(e: Expr) -> None:
    """The frontend, the TL-graph text and the kernel-IR text share one grammar and one builder."""
    text = str(e)
    alone = parse_expr(text)
    (stmt,) = parse_text(f"Allocate S in register ({text}, 4)\n", "t.tl").body
    assert stmt.shape[0] == alone == parsed_form(e)
    assert parse_attr(f"`{text}`") == alone


def test_negation_never_prints_a_decrement() -> None:
    """`--x` is a decrement in C++; a negated negative operand gets parentheses in every spelling."""
    from tlc.backend_cute.cpp import cpp_expr

    for e in (Neg(Neg(Var("x"))), Neg(Const(-1)), Neg(Const(-math.inf))):
        assert "--" not in print_expr(e) and "--" not in cpp_expr(e)
        assert parse_expr(print_expr(e)) == parsed_form(e)


@pytest.mark.parametrize("text, col, words", [
    ("Allocate S in register (4, a < b)", 30, "'<' is not a TL operator"),
    ("Allocate S in register (4, p.x)", 29, "only '.T' (transpose) may follow a name"),
    ("Copy Q (4, sK[1]) from global to shared", 12, "only in a loop bound, a mask predicate or a global tensor's row "
     "extent, and never of a tile"),
    ("Allocate S in register (4, exp2(n))", 28, "unknown function 'exp2'; the functions are cdiv(a, b), min"),
    ("Allocate S in register (4, int)", 28, "'int' is a C++ keyword"),
])
def test_the_tl_subset_refuses_the_rest_of_the_language_at_its_column(text: str, col: int, words: str) -> None:
    with pytest.raises(TlcError) as info:
        parse_text(text + "\n", "t.tl")
    (d,) = info.value.diagnostics
    assert (d.loc.line, d.loc.col) == (1, col) and words in d.message, d.message


# ------------------------------------------------------------------ evaluation


def _lowering() -> ExprLowering:
    lowering = ExprLowering({"BM": 64}, {"seqlen_k": "int"}, {"seqlen_k": "seqlen_k"})
    lowering.bind("n", "n")
    return lowering


def _float_modulo(e: Expr) -> bool:
    is_int = _lowering()._is_int
    return any(isinstance(x, BinOp) and x.op == "%" and not (is_int(x.lhs) and is_int(x.rhs)) for x in X.subexprs(e))


def _agree(e: Expr, bound: bool, n: int, seqlen_k: int) -> None:
    """TL rules on the TL expression == C rules on its lowering (`/` → floor_div or ceil_div,
    `%` → floor_mod unless both operands are provably non-negative)."""
    try:
        want = eval_expr(e, {"n": n, "BM": 64, "seqlen_k": seqlen_k, "head_idx": 5}, ceil_div=bound)
    except (ExprError, OverflowError, ZeroDivisionError):
        return
    try:
        kernel = _lowering().lower(e, None, ceil=bound)
    except TlcError as exc:  # only a `%` with a float operand is refused: C++'s `%` takes integers only
        assert _float_modulo(e) and "integer operands" in str(exc), (str(e), str(exc))
        return
    # a float operand folded away before the `%` (min(0, 0.0) is the int 0, as in the interpreter)
    # is no refusal: the kernel must then compute what the interpreter computes, as below
    got = kir_evaluate.evaluate(kernel, {"n": n, "head_idx": 5, "p.seqlen_k": seqlen_k})
    # Both NaN agrees too (e.g. ceil_div(inf, n) after a division by a denormal).
    assert got == pytest.approx(want, rel=1e-9, abs=1e-9, nan_ok=True), (str(e), str(kernel))


@_SETTINGS
@given(TL_EXPRS, st.booleans(), st.integers(-100, 100), st.integers(-2000, 2000))
def test_the_kernel_computes_what_the_interpreter_computes(e: Expr, bound: bool, n: int, seqlen_k: int) -> None:
    """`%` included: negative operands come from negations and from negative runtime values."""
    _agree(e, bound, n, seqlen_k)


@pytest.mark.parametrize("text", ["-(BM / min(n, 3.0))", "BM / max(n, 3.0)", "min(n, 3.0) % 2"])
def test_min_and_max_of_an_int_and_a_float_are_floats_as_in_cpp(text: str) -> None:
    """min(3, 3.0) is 3.0 on both sides (Python's min would give the int 3 and a rounding `/`)."""
    assert eval_expr(parse_expr("min(n, 3.0)"), {"n": 3}) == 3.0 and isinstance(
        eval_expr(parse_expr("min(n, 3.0)"), {"n": 3}), float)
    for bound in (False, True):
        _agree(parse_expr(text), bound, 3, 0)


@pytest.mark.parametrize("text", [
    "-n % BM", "n % BM", "(n - BM) % 7", "n % -3", "seqlen_k % (0 - BM)", "(seqlen_k - 1000) % BM + 1",
    "-7 % 2", "7 % -2", "head_idx % 3", "(head_idx - 6) % 4", "cdiv(seqlen_k, BM) % n", "seqlen_k / BM % 3",
])
@pytest.mark.parametrize("n, seqlen_k", [(3, 1000), (-3, -1000), (-65, 7)])
def test_the_kernel_s_modulo_floors_like_the_interpreter_s(text: str, n: int, seqlen_k: int) -> None:
    for bound in (False, True):
        _agree(parse_expr(text), bound, n, seqlen_k)


@pytest.mark.parametrize("text, tl, tl_bound, c", [
    ("-7 / 2", -4, -3, -3), ("7 / 2", 3, 4, 3), ("-7 % 2", 1, 1, -1), ("7.0 / 2", 3.5, 3.5, 3.5),
    ("7 % -2", -1, -1, 1), ("floor_mod(-7, 2)", 1, 1, 1), ("floor_mod(7, -2)", -1, -1, -1),
    ("cdiv(7, 2)", 4, 4, 4), ("min(3, 1, 2)", 1, 1, 1), ("max(1, 2) * 2 - 1", 3, 3, 3),
])
def test_one_evaluator_under_each_level_s_rules(text: str, tl, tl_bound, c) -> None:
    e = parse_expr(text)
    assert (evaluate(e, {}, X.TL), evaluate(e, {}, X.TL_BOUND), evaluate(e, {}, X.C)) == (tl, tl_bound, c)
    assert (eval_expr(e, {}), eval_expr(e, {}, ceil_div=True)) == (tl, tl_bound)


def test_evaluation_errors_are_expr_errors() -> None:
    for text in ("a + 1", "1 / 0", "cdiv(1, 0)", "floor_mod(1, 0)", "sK[1]"):
        with pytest.raises(ExprError):
            evaluate(parse_expr(text), {})
    with pytest.raises(TlcError, match="has no value"):
        kir_evaluate.evaluate(parse_expr("a + 1"), {})


def test_free_names_substitute_and_fold() -> None:
    e = parse_expr("sK[_, k] + min(n, BM * 2) - p.sk")
    assert free_names(e) == {"sK", "k", "n", "BM", "p.sk"}
    assert str(substitute(e, "BM", Const(64))) == "sK[_, k] + min(n, 64 * 2) - p.sk"
    assert str(fold(substitute(e, "BM", Const(64)))) == "sK[_, k] + min(n, 128) - p.sk"
    assert fold(parse_expr("ceil_div(100, 64) + floor_div(7, 2) * 2")) == Const(8)
    assert fold(parse_expr("7 / 2")) == parse_expr("7 / 2")  # `/` depends on the level: never folded
    assert fold(parse_expr("floor_mod(-7, 2) + 7 % 2")) == Const(2)
    assert fold(parse_expr("-7 % 2")) == parse_expr("-7 % 2")  # C's `%` of a negative: left to the level


# ------------------------------------------------------------------ one set of classes


def _exprs_in(obj) -> list[Expr]:
    """Every expression held by the fields of a dataclass op (and the tuples inside them)."""
    found: list[Expr] = []

    def visit(v) -> None:
        if isinstance(v, Expr):
            found.extend(X.subexprs(v))
        elif isinstance(v, tuple):
            for x in v:
                visit(x)

    for f in dataclasses.fields(obj):
        visit(getattr(obj, f.name))
    return found


def test_the_tl_graph_and_the_kernel_ir_hold_the_same_node_classes() -> None:
    from pathlib import Path

    from tlc.api import compile_graph
    from tlc.lowering.emit_text import kernel_ir

    assert (A.Num, A.Name, A.BinOp, A.Neg, A.Call) == (Const, Var, BinOp, Neg, Call)
    assert (K.Const, K.Var, K.BinOp, K.Neg, K.Call, K.Index, K.Expr) == (*NODE_CLASSES, Expr)
    spec = Path(__file__).resolve().parents[2] / "specs" / "mha_fwd.tl"
    graph, _ = compile_graph(spec.read_bytes(), str(spec), defines={"Causal": "true"})
    tl_nodes = [x for _, op in graph.walk() for x in _exprs_in(op)]
    kir_nodes: list[Expr] = []

    def walk_kir(op) -> None:
        kir_nodes.extend(_exprs_in(op))
        for f in dataclasses.fields(op):
            for child in (v for v in (getattr(op, f.name),) if isinstance(v, tuple)):
                for c in child:
                    if dataclasses.is_dataclass(c) and not isinstance(c, Expr):
                        walk_kir(c)

    walk_kir(kernel_ir(spec, defines={"Causal": True}))
    assert tl_nodes and kir_nodes
    assert {type(x) for x in tl_nodes} <= set(NODE_CLASSES) and {type(x) for x in kir_nodes} <= set(NODE_CLASSES)
    assert {BinOp, Var, Const} <= {type(x) for x in tl_nodes} & {type(x) for x in kir_nodes}


def test_lowering_rewrites_names_and_division_but_keeps_nodes() -> None:
    """No class-by-class translation: a node the lowering has no decision about is the same object."""
    lowering = ExprLowering({"BM": 64}, {"seqlen_k": "int"}, {"seqlen_k": "seqlen_k"})
    seven = Const(7)
    assert lowering.lower(seven, None) is seven
    assert str(lowering.lower(parse_expr("cdiv(seqlen_k, BM) + head_idx / 2"), None)) == \
        "ceil_div(p.seqlen_k, 64) + floor_div(head_idx, 2)"
    assert str(lowering.lower(parse_expr("min(seqlen_k, BM, 3 * BM)"), None)) == "min(min(p.seqlen_k, 64), 192)"


def test_lowering_keeps_tl_s_floored_modulo() -> None:
    """TL's `%` floors; the kernel's C++ `%` truncates. The lowering writes `floor_mod` unless
    both operands are provably non-negative, where the two agree and the C++ stays as it was."""
    lowering = _lowering()

    def lower(text: str) -> str:
        return str(lowering.lower(parse_expr(text), None))

    assert lower("n % 2") == "floor_mod(n, 2)"                    # a loop variable may be negative
    assert lower("(n - 1) % BM") == "floor_mod(n - 1, 64)"
    assert lower("seqlen_k % BM") == "floor_mod(p.seqlen_k, 64)"  # a runtime Input is not proven >= 0
    assert lower("head_idx % -3") == "floor_mod(head_idx, -3)"    # a negative divisor
    assert lower("(n - 1) % 2") == "floor_mod(n - 1, 2)"
    assert lower("n / 2 % 2") == "floor_mod(floor_div(n, 2), 2)"
    assert lower("head_idx % group") == "head_idx % group"        # built-in indices are >= 0
    assert lower("(head_idx + 3) % cdiv(BM, 2)") == "(head_idx + 3) % 32"
    assert lower("-7 % 2") == "1" and lower("7 % 2") == "1"       # constants fold, floored
    assert str(lowering.lower(parse_expr("(n - 1) % 2"), None, ceil=True)) == "floor_mod(n - 1, 2)"
    lowering.bind("head_idx", "n")  # a rebound built-in name proves nothing
    assert lower("head_idx % 2") == "floor_mod(n, 2)"


def test_lowering_refuses_a_float_modulo_with_its_location() -> None:
    from tlc.diagnostics import Loc

    lowering = ExprLowering({"BM": 64}, {"scale": "float"}, {"scale": "scale"})
    with pytest.raises(TlcError) as info:
        lowering.lower(parse_expr("scale % 2"), Loc("t.tl", 7, 3, 12))
    (d,) = info.value.diagnostics
    assert d.loc.line == 7 and "p.scale % 2" in d.message and "integer operands" in d.message
