"""Every failure honest (frontend): what the interpreter rejects or what cannot mean
anything is a `file:line:col` diagnostic from `tlc check`, never a pass followed by a crash
later (KeyError, ExprError, ZeroDivisionError, RecursionError)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from tlc.api import check_source, lower_source
from tlc.cli import main
from tlc.diagnostics import TlcError
from tlc.ir.types import DTYPES

ROOT = Path(__file__).resolve().parents[2]
# the spec without its comments, whose sketch repeats statement lines
MHA = "".join(line for line in (ROOT / "specs" / "mha_fwd.tl").read_text().splitlines(True) if not line.startswith("#"))
LOOP = "for n = 0:seqlen_k / BN"
LOCATED = re.compile(r"^(\S+):(\d+):(\d+): error: (.*)$", re.MULTILINE)


def line_of(text: str, fragment: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if fragment in line)


def errors(text: str, **kw) -> list[tuple[int, int, str]]:
    """(line, col, message) of every error `tlc check` reports; [] when it accepts."""
    res = check_source(text, "p.tl", **kw)
    return [(d.loc.line, d.loc.col, d.message) for d in res.diagnostics
            if d.severity == "error" and d.loc is not None]


def only_error(text: str, **kw) -> tuple[int, int, str]:
    found = errors(text, **kw)
    assert len(found) == 1, found
    return found[0]


# ------------------------------------------------------------------ (3) loops that never run


@pytest.mark.parametrize("header", ["for n = 4:2", "for n = 0:0", "for n = 0:BN - 64", "for n = BN / BN:1"])
def test_loop_with_compile_time_bounds_that_never_runs_is_rejected(header: str) -> None:
    text = MHA.replace(LOOP, header)
    line, col, message = only_error(text)
    assert (line, col) == (line_of(text, header), 1)
    assert f"loop 'n' never runs" in message and "larger than the start" in message


@pytest.mark.parametrize("header", ["for n = 0:1", "for n = 2:4", "for n = 0:BN / 64", "for n = 0:seqlen_k / BN"])
def test_loops_that_run_or_have_runtime_bounds_are_accepted(header: str) -> None:
    assert errors(MHA.replace(LOOP, header)) == []


# ------------------------------------------------------------------ (3) builtin function arity


@pytest.mark.parametrize("expr,message", [
    ("cdiv(n)", "'cdiv' takes exactly 2 arguments, got 1; write cdiv(a, b)"),
    ("cdiv(n, 1, 2)", "'cdiv' takes exactly 2 arguments, got 3"),
    ("min(n)", "'min' takes at least 2 arguments, got 1"),
    ("max(n)", "'max' takes at least 2 arguments, got 1"),
    ("n / 0", "division by zero in a coordinate"),
    ("cdiv(n, BN - 64)", "division by zero in a coordinate"),
])
def test_wrong_function_arity_or_constant_zero_divisor_is_located(expr: str, message: str) -> None:
    """A bad call is a syntax error at the call's name; a zero divisor, at the statement."""
    text = MHA.replace("Copy K (BN, HeadDim) in coordinate [L = n]", f"Copy K (BN, HeadDim) in coordinate [L = {expr}]")
    line, col, got = only_error(text)
    copy_line = next(t for t in text.splitlines() if f"[L = {expr}]" in t)
    call_col = copy_line.index(f"[L = {expr}]") + len("[L = ") + 1
    assert line == line_of(text, f"[L = {expr}]") and col == (3 if "division" in message else call_col)
    assert message in got


def test_functions_with_the_right_arity_still_check() -> None:
    text = MHA.replace("[L = n]", "[L = min(n, max(n, cdiv(n, 1)))]")
    assert errors(text) == []


# ------------------------------------------------------------------ (3) empty shared buffers

FILL_K = "  Copy K (BN, HeadDim) in coordinate [L = n] from global to shared\n"


def test_copy_from_a_shared_buffer_nothing_was_copied_into_is_rejected() -> None:
    text = MHA.replace(FILL_K, "")
    line, col, message = only_error(text)
    assert (line, col) == (line_of(text, "Copy K from shared to register"), 8)
    assert "'K' is read from shared memory before anything is copied into it" in message


def test_gemm_operand_from_an_empty_shared_buffer_is_rejected() -> None:
    text = MHA.replace(FILL_K, "").replace("  Copy K from shared to register\n", "")
    line, col, message = only_error(text)
    assert line == line_of(text, "Compute GEMM Q, K.T") and "'K' is read from shared memory before" in message
    res = check_source(text, "p.tl")
    assert "note: 'K' is allocated in shared memory here" in res.rendered


def test_reading_a_shared_buffer_before_it_is_filled_in_the_same_trip_is_rejected() -> None:
    """The first trip would read the empty buffer (the refill comes after the read)."""
    text = MHA.replace(FILL_K, "").replace("  Copy V (BN, HeadDim) in coordinate [L = n] from global to shared\n",
                                           "  Copy V (BN, HeadDim) in coordinate [L = n] from global to shared\n"
                                           "  Copy K from shared to register\n" + FILL_K)
    found = errors(text)
    assert [(line, "'K' is read from shared memory before" in m) for line, _, m in found] \
        == [(line_of(text, "Copy K from shared to register"), True)]


def test_a_buffer_filled_before_the_loop_may_be_read_then_refilled_inside() -> None:
    """Prefetching: the first trip reads what the prologue copied."""
    prologue = "Copy K (BN, HeadDim) in coordinate [L = 0] from global to shared\n"
    text = MHA.replace(LOOP, prologue + LOOP).replace(FILL_K, "").replace(
        "  Copy K from shared to register\n", "  Copy K from shared to register\n" + FILL_K)
    assert errors(text, run_passes=False) == []


# ------------------------------------------------------------------ (9) dtype spellings


@pytest.mark.parametrize("alias", sorted(k for k, v in DTYPES.items() if v != "fp32"))
def test_dtype_aliases_are_canonical_after_the_frontend(alias: str) -> None:
    graph = lower_source(MHA.replace("Param dtype = bf16", f"Param dtype = {alias}"), "p.tl")
    canonical = DTYPES[alias]
    assert graph.params["dtype"] == canonical
    seen = {v.type.dtype for _, op in graph.walk() for v in op.results if v.type.dtype is not None}
    assert seen <= {"bf16", "fp16", "fp32", "int"} and canonical in seen


def test_half_is_fp16_everywhere_the_passes_look() -> None:
    res = check_source(MHA.replace("Param dtype = bf16", "Param dtype = half"), "p.tl")
    assert res.ok, res.rendered
    assert res.graph.params["dtype"] == "fp16"
    allocs = {op.dtype for _, op in res.graph.walk() if getattr(op, "mnemonic", "") in ("allocate", "reshape")}
    assert allocs <= {"fp16", "fp32"} and "fp16" in allocs


def test_dtype_define_and_as_clauses_are_canonical_too() -> None:
    text = MHA.replace("Allocate Q in shared (BM, HeadDim)", "Allocate Q in shared (BM, HeadDim) as bfloat16")
    graph = lower_source(text, "p.tl", defines={"dtype": "float16"})
    assert graph.params["dtype"] == "fp16"
    q = next(op for _, op in graph.walk() if getattr(op, "name", None) == "Q" and op.space == "shared")
    assert q.dtype == "bf16"


@pytest.mark.parametrize("value,words", [("int8", "'int8' is not an element type"),
                                         ("fp32", "fp32 is the accumulators' type")])
def test_bad_program_dtype_is_one_error_at_its_param(value: str, words: str) -> None:
    text = MHA.replace("Param dtype = bf16", f"Param dtype = {value}")
    line, col, message = only_error(text)  # not repeated where `as dtype` uses it
    assert (line, col) == (line_of(text, "Param dtype"), 1)
    assert words in message and "bf16 (bfloat16)" in message and "fp16 (" in message


# ------------------------------------------------------------------ (10) long expressions


def long_sum(terms: int) -> str:
    return " + ".join(["n"] * terms)


@pytest.mark.parametrize("expr", [long_sum(500), "-(" * 300 + "n" + ")" * 300, "cdiv(" * 200 + "n" + ", 2)" * 200],
                         ids=["sum", "negations", "calls"])
def test_huge_expression_is_a_located_diagnostic_through_the_api(expr: str) -> None:
    text = MHA.replace("[L = n]", f"[L = {expr}]", 1)
    res = check_source(text, "deep.tl")
    assert not res.ok
    (d,) = res.diagnostics
    assert d.loc.line == line_of(text, f"[L = {expr[:12]}") and d.loc.col > 1
    assert "expression too long or too deep" in d.message and "at most 64" in d.message


def test_huge_expression_is_a_located_diagnostic_through_the_cli(tmp_path, capsys) -> None:
    path = tmp_path / "deep.tl"
    path.write_text(MHA.replace("[L = n]", f"[L = {long_sum(500)}]", 1))
    assert main(["check", str(path)]) == 1
    err = capsys.readouterr().err
    assert LOCATED.search(err) and "expression too long or too deep" in err
    assert "nests too deeply" not in err and "Traceback" not in err


def test_a_long_loop_header_keeps_the_block_structure() -> None:
    """One error for the header, none for its body or its `end`."""
    text = MHA.replace(LOOP, LOOP + " + 0" * 100)
    (line, _, message), = errors(text)
    assert line == line_of(text, "for n = ") and "too long" in message


def test_expressions_at_the_limit_pass_every_check() -> None:
    text = MHA.replace(LOOP, LOOP + " + 0" * 62).replace("[L = n]", f"[L = {long_sum(32)}]")
    assert errors(text, defines={"Causal": "true", "Align": "bottom_right"}) == []


# ------------------------------------------------------------------ (11) -D values


@pytest.mark.parametrize("name,value,kind", [
    ("HeadDim", "abc", "a positive integer"), ("HeadDim", "64.0", "a positive integer"),
    ("HeadDim", "-64", "a positive integer"), ("BM", "0", "a positive integer"), ("BM", "", "a positive integer"),
    ("Causal", "maybe", "a bool (true or false)"), ("Causal", "1", "a bool (true or false)"),
    ("Align", "3", "an identifier"), ("dtype", "", "an identifier"),
])
def test_define_of_the_wrong_kind_is_one_error_at_the_param(name: str, value: str, kind: str) -> None:
    line, col, message = only_error(MHA, defines={name: value})
    assert (line, col) == (line_of(MHA, f"Param {name} ="), 1)
    assert f"-D {name}={value}:" in message and f"Param '{name}' is declared as {kind}" in message
    assert (f"not {value!r}" if value else "it gives nothing") in message


@pytest.mark.parametrize("define", ["HeadDim=abc", "HeadDim=64.0", "HeadDim=-64", "BM=0", "BM="])
def test_define_of_the_wrong_kind_through_the_cli(define: str, capsys) -> None:
    assert main(["check", "-D", define, str(ROOT / "specs" / "mha_fwd.tl")]) == 1
    err = capsys.readouterr().err
    assert len(LOCATED.findall(err)) == 1 and f"-D {define}" in err and "internal error" not in err


def test_defines_of_the_right_kind_are_accepted() -> None:
    defines = {"HeadDim": "64", "BM": "64", "Causal": "TRUE", "Align": "bottom_right", "dtype": "half"}
    assert errors(MHA, defines=defines) == []


def test_define_of_an_unknown_param_keeps_its_error() -> None:
    res = check_source(MHA, "p.tl", defines={"Unknown": "3"})
    assert not res.ok and "-D Unknown: the program has no 'Param Unknown'; known: Align, BM" in res.rendered


# ------------------------------------------------------------------ (14) tabs and spaces

BODY = ("Param BM = 4\nAllocate S in register (BM, BM)\nfor n in 0:2:\n"
        "{a}Compute Exp S and get new S\n{b}Compute Exp S and get new S\n")


@pytest.mark.parametrize("a,b", [("\t", "    "), ("    ", "\t"), ("  ", " \t")])
def test_tabs_and_spaces_mixed_across_an_indented_loop_are_rejected(a: str, b: str) -> None:
    with pytest.raises(TlcError) as exc:
        lower_source(BODY.format(a=a, b=b), "t.tl")
    (d,) = exc.value.diagnostics
    assert (d.loc.line, d.loc.col) == (5, 1) and "indentation mixes tabs and spaces" in d.message


@pytest.mark.parametrize("a", ["\t", "    "])
def test_one_kind_of_indentation_is_accepted(a: str) -> None:
    lower_source(BODY.format(a=a, b=a), "t.tl")


def test_mixed_indentation_outside_indented_loops_is_ignored() -> None:
    lower_source("Param BM = 4\n\tAllocate S in register (BM, BM)\n    Compute Exp S and get new S\n", "t.tl")


# ------------------------------------------------------------------ (18) unknown operations


SOFTMAX = "  Compute Softmax S with max m, sum l and get P"


@pytest.mark.parametrize("original,typo,word,suggestion", [
    (SOFTMAX, "  Compute Sofmax S", "Sofmax", "Softmax"),                           # not even parseable
    (SOFTMAX, "  Compute Sofmax S with max m, sum l and get P", "Sofmax", "Softmax"),
    (SOFTMAX, "  Compute Softmx S and get P", "Softmx", "Softmax"),                 # parses as elementwise
    ("  Compute GEMM Q, K.T and get S", "  Compute GEM Q, K.T and get S", "GEM", "GEMM"),
    ("  Compute Multiply S, scale and get new S", "  Compute Multply S, scale and get new S", "Multply", "Multiply"),
])
def test_unknown_operation_is_named_with_the_closest_one(original: str, typo: str, word: str,
                                                         suggestion: str) -> None:
    text = MHA.replace(original, typo)
    found = [(line, col, m) for line, col, m in errors(text) if "unknown operation" in m]
    assert [(line, col) for line, col, _ in found] == [(line_of(text, typo.strip()), 11)]
    assert f"unknown operation '{word}'; did you mean '{suggestion}'?" in found[0][2]


@pytest.mark.parametrize("define,needs", [("TmaStore=maybe", "needs a bool"), ("Stages=0", "needs a positive integer"),
                                          ("PingPong=", "needs a bool")])
def test_a_schedule_define_of_the_wrong_kind_is_one_error(define: str, needs: str) -> None:
    """Schedule knobs bind by -D without a Param; a wrong value is still one located error."""
    name, value = define.split("=")
    res = check_source(MHA, "p.tl", defines={name: value})
    assert not res.ok and f"-D {define}: the schedule option {name} {needs}" in res.rendered
    assert errors(MHA, defines={"Stages": "3", "TmaStore": "true", "Overlap": "false"}) == []
