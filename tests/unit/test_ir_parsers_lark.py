"""The lark-based IR text parsers: kernel IR (`parse_kir`), its expressions (`parse_expr`) and
the TL IR (`parse_ir`) round-trip everything the project prints, and bad text is a located
`TlcError` saying what was expected, never a lark exception."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.expr_forms import parsed_form
from tlc.api import compile_graph
from tlc.diagnostics import TlcError
from tlc.ir.irparser import parse_ir
from tlc.ir.printer import print_graph
from tlc.kir.expr import BINOPS, FUNCTIONS, BinOp, Call, Const, Expr, Index, Neg, Var, parse_expr, print_expr
from tlc.kir.text import parse_kir, print_kir
from tlc.lowering.emit_text import emit_text
from tests.spec_files import ONE_KERNEL_SPECS

SPECS = ONE_KERNEL_SPECS
REFUSED_BY_BACKEND = {"mla_decode_fwd"}  # over the register budget: the lowering refuses it


@pytest.fixture(scope="module")
def kir_texts() -> dict[str, str]:
    return {spec.stem: emit_text(spec.read_bytes(), str(spec), "sm_90", {}, "kir")
            for spec in SPECS if spec.stem not in REFUSED_BY_BACKEND}


@pytest.fixture(scope="module")
def ir_texts() -> dict[str, str]:
    return {spec.stem: print_graph(compile_graph(spec.read_bytes(), str(spec))[0]) for spec in SPECS}


# ------------------------------------------------------------------ round trips of shipped specs


@pytest.mark.parametrize("stem", [s.stem for s in SPECS if s.stem not in REFUSED_BY_BACKEND])
def test_kernel_ir_of_every_spec_round_trips(stem: str, kir_texts: dict[str, str]) -> None:
    text = kir_texts[stem]
    program = parse_kir(text)
    assert print_kir(program) == text
    assert parse_kir(print_kir(program)) == program


@pytest.mark.parametrize("stem", [s.stem for s in SPECS])
def test_tl_ir_of_every_spec_after_the_default_passes_round_trips(stem: str, ir_texts: dict[str, str]) -> None:
    text = ir_texts[stem]
    assert ("loop(" in text or stem == "merge_states") and "loc(" in text   # merge_states: no loop
    assert print_graph(parse_ir(text)) == text


def test_every_expression_in_the_kernel_ir_round_trips(kir_texts: dict[str, str]) -> None:
    import re

    exprs = {m for text in kir_texts.values() for m in re.findall(r"`([^`]*)`", text)}
    assert len(exprs) > 50
    for text in exprs:
        assert print_expr(parse_expr(text)) == text


# ------------------------------------------------------------------ expressions


_names = st.sampled_from(["n", "x0", "block_idx", "p.seqlen_k", "blockIdx.x", "sK", "_", "tSrS"])
_consts = st.one_of(st.integers(-(10**6), 10**6), st.booleans(), st.just(math.inf), st.just(-math.inf),
                    st.floats(allow_nan=False, allow_infinity=False, min_value=-1e20, max_value=1e20))
_leaves = st.one_of(_names.map(Var), _consts.map(Const))


def _extend(sub: st.SearchStrategy[Expr]) -> st.SearchStrategy[Expr]:
    call = st.sampled_from(sorted(FUNCTIONS)).flatmap(
        lambda fn: st.lists(sub, min_size=FUNCTIONS[fn][0], max_size=FUNCTIONS[fn][1] or FUNCTIONS[fn][0] + 2).map(
            lambda a: Call(fn, tuple(a))))
    index = st.tuples(st.sampled_from(["sK", "tSrS", "p.tile"]).map(Var), st.lists(sub, min_size=1, max_size=3))
    return st.one_of(st.builds(BinOp, st.sampled_from(sorted(BINOPS)), sub, sub), sub.map(Neg), call,
                     index.map(lambda t: Index(t[0], tuple(t[1]))))


EXPRS = st.recursive(_leaves, _extend, max_leaves=25)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(EXPRS)
def test_random_expressions_round_trip(e: Expr) -> None:
    parsed = parse_expr(print_expr(e))
    assert parsed == parsed_form(e)
    text = print_expr(parsed)  # what the project prints: minus signs already folded
    assert print_expr(parse_expr(text)) == text


@pytest.mark.parametrize("first", sorted(BINOPS))
@pytest.mark.parametrize("second", sorted(BINOPS))
def test_the_grammar_binds_as_the_precedence_table_says(first: str, second: str) -> None:
    e = parse_expr(f"a {first} b {second} c")
    if BINOPS[first] >= BINOPS[second]:  # left-associative at equal precedence
        assert e == BinOp(second, BinOp(first, Var("a"), Var("b")), Var("c"))
    else:
        assert e == BinOp(first, Var("a"), BinOp(second, Var("b"), Var("c")))


def test_unary_minus_binds_tightest_and_folds_into_numbers() -> None:
    assert parse_expr("-x * y") == BinOp("*", Neg(Var("x")), Var("y"))
    assert parse_expr("- -3") == Const(3) and parse_expr("-(2.5)") == Const(-2.5)
    assert parse_expr("-inf") == Const(-math.inf) and parse_expr("-true") == Neg(Const(True))
    assert parse_expr("sK[_, _, n % 2]") == Index(Var("sK"), (Var("_"), Var("_"), BinOp("%", Var("n"), Const(2))))


# ------------------------------------------------------------------ malformed text


def _error(parse, text: str) -> tuple[str, int, int]:
    with pytest.raises(TlcError) as info:
        parse(text)
    (diag,) = info.value.diagnostics
    line = diag.loc.line if diag.loc else 0
    col = diag.loc.col if diag.loc else 0
    return diag.message, line, col


@pytest.mark.parametrize("text, line, col, words", [
    ("WaitOp(pending=1", 1, 17, "expected ')' or ',' but found the end of the text"),
    ("ProgramOp(name=p, body=[\n  WaitOp(pending=1\n])", 3, 1, "expected ')' or ','"),
    ("ProgramOp(name=p, body=[\n  WaitOp(pending=`n +`)\n])", 2, 22, "expected '(', '-', a name or a number"),
    ("ProgramOp(name=p, body=[\n  WaitOp(pending=`foo(n)`)\n])", 2, 19, "unknown function 'foo'"),
    ("ProgramOp(name=p, body=[\n  WaitOp(pendng=1)\n])", 2, 10, "WaitOp has no field 'pendng'"),
    ("ProgramOp(name=p, body=[\n  Wait(pending=1)\n])", 2, 3, "unknown kernel-IR op 'Wait'"),
    ("WaitOp(pending=$)", 1, 16, "unexpected character '$'"),
    ("WaitOp(pending=1) @\"f.tl\":3", 1, 28, "expected ':'"),
    ("ProgramOp(name=p, body=[]) trailing", 1, 28, "trailing text after the program"),
    ("", 1, 1, "expected a name but found the end of the text"),
])
def test_malformed_kernel_ir_is_a_located_diagnostic(text: str, line: int, col: int, words: str) -> None:
    message, got_line, got_col = _error(parse_kir, text)
    assert words in message and (got_line, got_col) == (line, col), message


@pytest.mark.parametrize("text, col, words", [
    ("a +", 4, "expected '(', '-', a name or a number but found the end of the expression"),
    ("(a", 3, "expected ')' or an operator"),
    ("a b", 3, "an operator or the end of the expression but found 'b'"),
    ("min(a)", 1, "'min' takes at least 2 arguments, got 1"),
    ("a ? b", 3, "unexpected character '?'"),
    ("int + 1", 1, "C++ keyword 'int'"),
])
def test_malformed_expression_names_the_column(text: str, col: int, words: str) -> None:
    message, _, _ = _error(parse_expr, text)
    assert words in message and f"column {col}:" in message, message


@pytest.mark.parametrize("text, line, col, words", [
    ("", 1, 1, 'expected tl.program "FILE"'),
    ('tl.program "x"\n%a = nosuch() : register(?) fp32', 2, 6, "unknown op 'nosuch'"),
    ('tl.program "x"\n%a = elementwise(%b) {fn = exp} : register(?) fp32', 2, 18, "%b is used before it is defined"),
    ('tl.program "x"\n%a = full() {value = 0.0 : register(?) fp32', 2, 26, "expected ',' or '}' but found ':'"),
    ('tl.program "x"\n%a = full() {value = `1 +`} : register(?) fp32', 2, 26, "expected '(', '-', a name or a number"),
    ('tl.program "x"\n%a = full() {value = 0.0} : register(BM fp32', 2, 41, "expected '(', ')', ',', '[' or an operator"),
    ('tl.program "x"\n%a = full() {valu = 0.0} : register(?) fp32', 2, 14, "'full' has no attribute 'valu'"),
    ('tl.program "x"\n%a = full() {value = 0.0} : register(?) fp32 $', 2, 46, "unexpected character '$'"),
    ('tl.program "x"\n%a = loop() {var = n} : register(?) fp32', 2, 6, "a loop needs '^(args) ['"),
    ('tl.program "x"\nloop() {var = n} ^(%n : scalar int) [\n%a = full() {value = 0.0} : register(?) fp32\n',
     3, 45, "expected 'yield'"),
])
def test_malformed_tl_ir_is_a_located_diagnostic(text: str, line: int, col: int, words: str) -> None:
    message, got_line, got_col = _error(parse_ir, text)
    assert words in message and (got_line, got_col) == (line, col), message


def test_ir_comments_and_blank_lines_are_skipped() -> None:
    text = ('// a pass test\ntl.program "x"\n\n  // a note\nparam BM = 64  // tile rows\ninput s : int\n'
            '%a = full() {value = -inf, shape = (`BM`), dtype = fp32} : register(BM) fp32  loc(3:4) // why\n')
    graph = parse_ir(text)
    assert graph.params == {"BM": 64} and graph.inputs == {"s": "int"}
    assert print_graph(graph).endswith("%a = full() {value = -inf, shape = (`BM`), dtype = fp32} "
                                       ": register(BM) fp32  loc(3:4)\n")


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_damaged_text_is_a_diagnostic_never_a_lark_error(data, kir_texts: dict[str, str],
                                                         ir_texts: dict[str, str]) -> None:
    parse, texts = data.draw(st.sampled_from([(parse_kir, kir_texts), (parse_ir, ir_texts)]))
    text = texts[data.draw(st.sampled_from(sorted(texts)))]
    at = data.draw(st.integers(0, len(text) - 1))
    cut = data.draw(st.integers(0, 3))
    junk = data.draw(st.sampled_from(["", "(", ")", "[", "]", ",", "`", '"', "=", "%", "-", "x", "\n", "@", "$"]))
    damaged = text[:at] + junk + text[at + cut:]
    try:
        parse(damaged)
    except TlcError as exc:
        assert all(d.loc is not None and d.loc.line >= 1 for d in exc.diagnostics), exc.render()
