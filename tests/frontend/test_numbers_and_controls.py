"""Numbers and control bytes in TL text and `-D` values: ASCII digits within 32 bits, refused in tlc's
words at their column, and every control character escaped in what the renderer prints; the paper's
store rules on programs that store a tensor twice or store nothing."""
from __future__ import annotations

from pathlib import Path

import pytest

from tlc.api import compile_graph
from tlc.diagnostics import TlcError
from tlc.frontend.lower import lower_program
from tlc.frontend.parser import parse_text

MHA = (Path(__file__).resolve().parents[2] / "specs" / "mha_fwd.tl").read_text()
# The TL pipeline without `mask`, whose rules on stores are checked elsewhere: verify-final alone here.
UP_TO_VERIFY_FINAL = "verify,infer-shapes,resolve-transpose,insert-reshape,online-softmax,verify-final"
STORE = "Copy O (BM, HeadDim) in coordinate [L = block_idx] from register to global\n"


def _errors(text: str, defines: dict[str, str] | None = None) -> str:
    try:
        lower_program(parse_text(text, "t.tl"), defines)
    except TlcError as exc:
        return exc.render()
    return ""


@pytest.mark.parametrize("digits", ["\u0661\u0662\u0668", "\uff11\uff12"])  # Arabic-Indic, fullwidth: Python reads both
def test_a_literal_in_other_scripts_digits_is_refused_at_its_column(digits: str) -> None:
    rendered = _errors(MHA.replace("Param BM = 128", f"Param BM = {digits}"))
    assert f"t.tl:15:12: error: '{digits}' is not written in ASCII digits" in rendered


@pytest.mark.parametrize("where", ["Param BM = {}", "for n = 0:seqlen_k / BN + 0 * {}"])
def test_a_5000_digit_literal_is_refused_in_tlcs_words(where: str) -> None:
    head = where.split(" = ")[0]
    line = next(line for line in MHA.splitlines() if line.startswith(head))
    rendered = _errors(MHA.replace(line, where.format("1" * 5000)))
    assert "has 5000 digits; it must be from -2147483647 to 2147483647" in rendered
    assert "set_int_max_str_digits" not in rendered and "Exceeds the limit" not in rendered


def test_a_literal_past_32_bits_is_refused() -> None:
    rendered = _errors(MHA.replace("Param BM = 128", "Param BM = 4294967296"))
    assert "t.tl:15:12: error: number: 4294967296 is out of range" in rendered


def test_a_float_literal_past_floats_range_is_refused() -> None:
    rendered = _errors(MHA.replace("Param BM = 128", "Param BM = 128\nParam Big = 1e400"))
    assert "'1e400' is past a float's range" in rendered


@pytest.mark.parametrize("raw", ["1" * 5000, "\u0661\u0662\u0668", "1_000", "99999999999"],
                         ids=["5000-digits", "arabic-indic", "underscore", "past-32-bits"])
def test_a_define_that_is_no_32_bit_ascii_number_is_refused_in_one_line(raw: str) -> None:
    rendered = _errors(MHA, {"BM": raw})
    first = rendered.splitlines()[0]
    assert first.startswith("t.tl:15:1: error: -D BM") and "set_int_max_str_digits" not in rendered
    assert len(first) < 300


def test_control_bytes_in_a_source_line_and_message_are_escaped_and_the_caret_follows() -> None:
    rendered = _errors("Param BM = 64\n\x1b[2J\x9bFoo S\n")
    assert "\x1b" not in rendered and "\x9b" not in rendered
    message, line, caret = rendered.splitlines()[:3]
    assert message == "t.tl:2:1: error: unknown statement '\\x1b[2J\\x9bFoo'; a statement starts with Param, " \
                      "Input, Allocate, Copy, Compute, Reshape, for, end"
    assert line == "\\x1b[2J\\x9bFoo S"
    assert caret.startswith("^")


def test_escape_controls_escapes_c0_del_c1_and_invisible_marks_only() -> None:
    from tlc.diagnostics import escape_controls

    assert escape_controls("a\x1b[31mb\x7f\x85\u202e\u200bc\td\ne") == "a\\x1b[31mb\\x7f\\x85\\u202e\\u200bc\td\ne"
    assert escape_controls("plain ·→ text") == "plain ·→ text"
    once = escape_controls("\x00\x07")
    assert once == "\\x00\\x07" and escape_controls(once) == once


def test_a_second_store_of_one_tensor_finds_its_allocate() -> None:
    """The second store's target is the first store's result (SSA): verify-final follows it to the Allocate."""
    graph, _ = compile_graph(MHA + STORE, "t.tl", pipeline=UP_TO_VERIFY_FINAL)
    assert graph is not None


def test_a_store_then_a_load_of_one_tensor_finds_its_allocate() -> None:
    text = MHA + STORE + "Allocate O in shared (BM, HeadDim)\n" \
        "Copy O (BM, HeadDim) in coordinate [L = block_idx] from global to shared\n" + STORE.replace(
            "from register", "from shared")
    try:
        compile_graph(text, "t.tl", pipeline=UP_TO_VERIFY_FINAL)
    except TlcError as exc:
        assert "without a prior 'Allocate O in global" not in exc.render()


def test_a_program_with_params_and_inputs_only_computes_nothing() -> None:
    with pytest.raises(TlcError) as info:
        compile_graph("Param BM = 64\nInput seqlen_q : int\n", "t.tl")
    assert info.value.render().startswith("t.tl:1:1: error: the program computes nothing")
