"""Hypothesis properties of the frontend on generated TL programs (tlc.testing.tl_programs):
they parse and lower to structurally valid graphs, `tlc fmt` and the IR text round-trip,
the interpreter equals the float64 reference, and arbitrary input raises only TlcError."""
from __future__ import annotations

import importlib.util

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tlc.diagnostics import TlcError
from tlc.frontend import ast as A
from tlc.frontend.lower import lower_program
from tlc.frontend.parser import parse_text
from tlc.ir.printer import print_graph
from tlc.ir.verify import verify_structure
from tlc.testing import check_interpreter, tl_programs, with_shapes

torch.set_num_threads(1)
EXAMPLES = settings(max_examples=100, deadline=None, database=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def strip_style(stmts) -> list:
    out = []
    for s in stmts:
        if isinstance(s, A.ForStmt):
            s = A.ForStmt(s.var, s.start, s.stop, tuple(strip_style(s.body)), False, when=s.when)
        out.append(s)
    return out


@EXAMPLES
@given(tl_programs())
def test_generated_programs_lower_to_valid_graphs(text: str) -> None:
    graph = lower_program(parse_text(text, "gen.tl"))
    assert verify_structure(graph) == []


@pytest.mark.skipif(not has("tlc.frontend.format"), reason="tlc/frontend/format.py not written yet")
@EXAMPLES
@given(tl_programs())
def test_fmt_round_trip(text: str) -> None:
    from tlc.frontend.format import format_program

    program = parse_text(text, "gen.tl")
    formatted = format_program(program)
    again = parse_text(formatted, "fmt.tl")
    assert strip_style(again.body) == strip_style(program.body)
    assert format_program(again) == formatted  # canonical: fmt is idempotent


@pytest.mark.skipif(not has("tlc.ir.irparser"), reason="tlc/ir/irparser.py not written yet")
@EXAMPLES
@given(tl_programs())
def test_ir_text_round_trip(text: str) -> None:
    from tlc.ir.irparser import parse_ir

    printed = print_graph(lower_program(parse_text(text, "gen.tl")))
    assert print_graph(parse_ir(printed)) == printed


@EXAMPLES
@given(tl_programs().flatmap(with_shapes))
def test_interpreter_equals_reference(case) -> None:
    text, shapes = case
    result = check_interpreter(text, shapes, seed=7)
    assert result.ok, f"{shapes.describe()}: {result.describe()}\n{text}"


@EXAMPLES
@given(tl_programs(with_reshape=False).flatmap(with_shapes))
def test_programs_without_reshape_interpret_correctly(case) -> None:
    text, shapes = case
    assert check_interpreter(text, shapes, check_layouts=False).ok


TL_WORDS = st.sampled_from(["Param", "Input", "Allocate", "Copy", "Compute", "Reshape", "for", "end", "in", "global",
                            "shared", "register", "GEMM", "Softmax", "Mask", "and", "get", "new", "accumulate",
                            "with", "offset", "from", "to", "coordinate", "as", "when", "S", "Q", "K.T", "(", ")",
                            ",", "=", ":", "[", "]", "0", "4", "BM", "/", "\n", "  ", "\t", "#", "\x00", "é"])


@settings(max_examples=300, deadline=None, database=None, derandomize=True)
@given(st.one_of(st.text(max_size=200), st.binary(max_size=200),
                 st.lists(TL_WORDS, max_size=40).map(" ".join)))
def test_frontend_raises_only_diagnostics(data) -> None:
    try:
        lower_program(parse_text(data, "fuzz.tl"))
    except TlcError as exc:
        assert exc.diagnostics and all(d.severity == "error" for d in exc.diagnostics)
        exc.render()


@settings(max_examples=100, deadline=None, database=None, derandomize=True)
@given(tl_programs(), st.data())
def test_mutated_programs_raise_only_diagnostics(text: str, data) -> None:
    """Drop or duplicate a line of a valid program: still only diagnostics (or success)."""
    lines = text.splitlines()
    i = data.draw(st.integers(0, len(lines) - 1))
    mutated = lines[:i] + (lines[i:i + 1] * 2 if data.draw(st.booleans()) else []) + lines[i + 1:]
    try:
        lower_program(parse_text("\n".join(mutated), "mut.tl"))
    except TlcError:
        pass
