"""Predicate masks in TL (`Compute Mask S where <predicate>`): where comparisons, `&&`, `||` and the
positions `q_idx`, `kv_idx` are allowed (a mask predicate only) and refused (everywhere else, at their
column), the names a predicate may read, `tlc fmt` and the IR text round trips, and the interpreter's
meaning: a dense float64 softmax with the same positions masked, at odd sizes."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.conftest import diagnostics_of
from tests.frontend.window_reference import sliding_window_attention
from tlc.diagnostics import TlcError
from tlc.expr import parse_expr as parse_any_expr
from tlc.frontend.format import format_program
from tlc.frontend.lower import lower_program
from tlc.frontend.parser import parse_expr, parse_text
from tlc.ir.irparser import parse_ir
from tlc.ir.ops import MaskOp
from tlc.ir.printer import print_graph
from tlc.passes.pipeline import DEFAULT_PIPELINE, run_pipeline
from tlc.testing import Shapes, check_interpreter

ROOT = Path(__file__).resolve().parents[2]
MHA = (ROOT / "specs" / "mha_fwd.tl").read_text()
MASK_LINE = "Compute Mask S causal Align and get new S when Causal"


def program(mask: str, params: str = "") -> str:
    """mha_fwd.tl with its causal mask line replaced by `mask` and `params` declared after its Params."""
    assert MASK_LINE in MHA
    text = MHA.replace(MASK_LINE, mask).replace("Param Variant = attention\n", "")
    return text.replace("Param Align = top_left\n", "Param Align = top_left\n" + params)


def line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def masks(graph) -> list[MaskOp]:
    return [op for _, op in graph.walk() if isinstance(op, MaskOp)]


# ------------------------------------------------------------------ where the operators are allowed
@pytest.mark.parametrize("predicate", [
    "kv_idx > q_idx || kv_idx < q_idx - Window",
    "kv_idx >= Prefix && kv_idx > q_idx",
    "q_idx / 16 != kv_idx / 16 || (kv_idx - q_idx) % 3 == 1",
    "max(q_idx - Window, 0) > kv_idx && head_idx % 2 == 0 || batch_idx == 1 && kv_idx <= cdiv(seqlen_k, 2)",
    "kv_idx * scale > 2.5",
    "kv_idx != 3",
])
def test_a_predicate_mask_lowers_and_formats_back_to_itself(predicate: str) -> None:
    text = program(f"Compute Mask S where {predicate} and get new S", "Param Window = 8\nParam Prefix = 5\n")
    graph = lower_program(parse_text(text, "p.tl"))
    (mask,) = masks(graph)
    assert (mask.kind, str(mask.predicate)) == ("predicate", str(parse_any_expr(predicate)))
    canonical = format_program(parse_text(text, "p.tl"))
    assert format_program(parse_text(canonical, "p.tl")) == canonical
    assert f"Compute Mask S where {parse_any_expr(predicate)} and get new S" in canonical


def test_where_is_a_keyword_in_any_case_and_a_guard_may_follow() -> None:
    text = program("compute MASK S WHERE kv_idx > q_idx and get new S when Sliding", "Param Sliding = true\n")
    assert [m.kind for m in masks(lower_program(parse_text(text, "p.tl")))] == ["predicate"]
    assert "Compute Mask S where kv_idx > q_idx and get new S when Sliding" in format_program(parse_text(text))
    off = lower_program(parse_text(text, "p.tl"), {"Sliding": "false"})
    assert masks(off) == []


def test_without_a_result_the_mask_replaces_its_input() -> None:
    text = program("Compute Mask S where kv_idx > q_idx")
    (mask,) = masks(lower_program(parse_text(text, "p.tl")))
    assert mask.result.base == "S"


def test_the_ir_text_round_trips_a_predicate_mask_before_and_after_the_passes() -> None:
    graph = lower_program(parse_text(program("Compute Mask S where kv_idx < q_idx - 3 || kv_idx > q_idx"), "p.tl"))
    text = print_graph(graph)
    assert print_graph(parse_ir(text)) == text
    assert "{kind = predicate, predicate = `kv_idx < q_idx - 3 || kv_idx > q_idx`}" in text
    run_pipeline(graph, DEFAULT_PIPELINE)
    text = print_graph(graph)   # the mask pass placed it: the trips it applies in (tlc/expr/key_window.py)
    assert print_graph(parse_ir(text)) == text
    assert ("{kind = predicate, from_iteration = [n = `floor_div(max(block_idx * BM, -1) + 1 - BN, BN) + 1`], predicate = "
            "`kv_idx < q_idx - 3 || kv_idx > q_idx`, until_iteration = [n = `cdiv(max(min((block_idx + 1) * BM, "
            "seqlen_q) - 1 - 3, 0), BN)`]}") in text


def test_a_predicate_mask_verifies_only_with_its_predicate() -> None:
    graph = lower_program(parse_text(program("Compute Mask S where kv_idx > q_idx"), "p.tl"))
    (mask,) = masks(graph)
    assert mask.verify() == []
    from dataclasses import replace
    assert "a predicate mask (and only it) has a predicate" in replace(mask, predicate=None).verify()
    assert "a predicate mask (and only it) has a predicate" in replace(mask, kind="causal").verify()


# ------------------------------------------------------------------ where they are refused
@pytest.mark.parametrize("line, at, message", [   # `at`: the text the caret points at (its last occurrence)
    ("Compute Add S, a < b and get new S", "<", "'<' is not a TL operator"),
    ("Compute Multiply S, q_idx and get new S", "q_idx", "'q_idx' is the global query row of a score: it has a "
                                                         "value only in a mask predicate"),
    ("Copy K (BN, HeadDim) in coordinate [L = kv_idx] from global to shared", "kv_idx", "'kv_idx' is the global key"),
    ("Allocate X in shared (BM == 2, HeadDim)", "==", "'==' is not a TL operator"),
    ("for m = 0:seqlen_k && 2", "&&", "'&&' is not a TL operator"),
    ("Compute Mask S where kv_idx - q_idx and get new S", "kv_idx - q_idx", "a mask predicate is a condition, true "
                                                                           "where a score is masked"),
    ("Compute Mask S where q_idx < kv_idx < 9", "<", "comparisons do not chain: write 'q_idx < kv_idx && kv_idx < 9'"),
    ("Compute Mask S where kv_idx > q_idx && Window", "&&", "'&&' joins conditions, but 'Window' is a number"),
    ("Compute Mask S where (kv_idx > 1) + 1 > 0", "+", "'+' takes numbers, but 'kv_idx > 1' is a condition"),
    ("Compute Mask S where (a < b) == (c < d)", "==", "'==' compares numbers, but 'a < b' is a condition"),
    ("Compute Mask S when kv_idx > q_idx", "when", "expected 'causal' or 'where' but found 'when' (form: Compute Mask"),
])
def test_operators_and_positions_are_refused_outside_a_predicate_at_their_column(line, at, message) -> None:
    got = diagnostics_of(line + "\n", "t.tl", sketch=True)
    assert got and got[0].startswith(f"1:{line.rindex(at) + 1}: {message}"), got


def test_parse_expr_refuses_comparisons_and_positions() -> None:
    for text in ("a < b", "q_idx + 1", "a || b"):
        with pytest.raises(Exception, match="not a TL operator|a value only in a mask predicate"):
            parse_expr(text)


@pytest.mark.parametrize("predicate, message", [
    ("kv_idx > block_idx", "'block_idx' is the query tile's index: a mask predicate reads where a score is"),
    ("kv_idx > n", "'n' is a loop variable: a mask predicate reads where a score is"),
    ("kv_idx > Q", "'Q' is a tile, but a mask predicate reads q_idx, kv_idx"),
    ("kv_idx > Causal", "Param 'Causal' = false is not a number, so a mask predicate cannot compare it; guard the "
                        "statement with 'when Causal' instead"),
    ("kv_idx > Align", "Param 'Align' = top_left is not a number"),
    ("kv_idx > Windw", "undefined name 'Windw' in the mask predicate (did you mean 'Window'?)"),
    ("kv_idx > q_idx / (BM - 64)", "division by zero in the mask predicate"),
])
def test_a_predicate_reads_positions_heads_params_and_inputs_only(predicate: str, message: str) -> None:
    text = program(f"Compute Mask S where {predicate} and get new S", "Param Window = 8\n")
    col = text.splitlines()[line_of(text, "Compute Mask") - 1].index(predicate) + 1
    got = diagnostics_of(text, "t.tl", defines={"BM": "64"} if "BM - 64" in predicate else None)
    assert any(d.startswith(f"{line_of(text, 'Compute Mask')}:{col}: {message}") for d in got), got


@pytest.mark.parametrize("text, message", [
    ("Param q_idx = 3\n", "'q_idx' is a built-in mask position; choose another parameter name"),
    ("Input kv_idx : int\n", "'kv_idx' is already declared"),
])
def test_the_position_names_are_reserved(text: str, message: str) -> None:
    assert any(message in d for d in diagnostics_of(text, sketch=True))


def test_a_loop_variable_may_not_be_named_like_a_position() -> None:
    got = diagnostics_of("for q_idx = 0:4\n  Compute Exp S and get new S\nend\n", sketch=True)
    assert any("loop variable 'q_idx' shadows" in d for d in got), got


# ------------------------------------------------------------------ meaning: a dense reference
SMALL = {"HeadDim": "5", "BM": "4", "BN": "4"}
ODD_SIZES = [(1, 1), (17, 17), (3, 5), (5, 3), (4, 4), (13, 17), (17, 9)]   # 1, 17, a tile ± 1, several tiles


def prefix_lm(Q, K, V, *, scale: float, prefix: int) -> torch.Tensor:
    """Dense float64 reference of `kv_idx >= Prefix && kv_idx > q_idx` masked: every row sees the first
    `prefix` keys and the causal ones."""
    S = Q.double() @ K.double().transpose(-1, -2) * scale
    i, j = torch.arange(Q.shape[2])[:, None], torch.arange(K.shape[2])[None, :]
    S = S.masked_fill((j >= prefix) & (j > i), float("-inf"))
    return torch.softmax(S, dim=-1).nan_to_num(0.0) @ V.double()


@pytest.mark.parametrize("sq, sk", ODD_SIZES)
@pytest.mark.parametrize("passes", [False, True], ids=["as-written", "after-passes"])
def test_the_sliding_window_spec_means_a_dense_window(sq: int, sk: int, passes: bool) -> None:
    graph = lower_program(parse_text((ROOT / "specs" / "sliding_window_fwd.tl").read_text(), "sw.tl"),
                          dict(SMALL, Window="5"))
    if passes:
        run_pipeline(graph, DEFAULT_PIPELINE)
    shapes = Shapes(2, 4, 2, {"seqlen_q": sq, "seqlen_k": sk}, {"scale": 0.37})
    result = check_interpreter(graph, shapes, seed=sq * 31 + sk,
                               reference=lambda Q, K, V, *, scale: sliding_window_attention(Q, K, V, scale=scale,
                                                                                            window=5))
    assert result.ok, result.describe()


@pytest.mark.parametrize("sq, sk", ODD_SIZES)
def test_a_prefix_lm_mask_means_the_prefix_and_the_causal_keys(sq: int, sk: int) -> None:
    text = program("Compute Mask S where kv_idx >= Prefix && kv_idx > q_idx and get new S", "Param Prefix = 6\n")
    graph = lower_program(parse_text(text, "p.tl"), SMALL)
    shapes = Shapes(1, 2, 2, {"seqlen_q": sq, "seqlen_k": sk}, {"scale": 0.5})
    result = check_interpreter(graph, shapes, seed=sq + sk,
                               reference=lambda Q, K, V, *, scale: prefix_lm(Q, K, V, scale=scale, prefix=6))
    assert result.ok, result.describe()


def test_a_wrong_window_fails_the_reference() -> None:
    """The check can fail: the spec at Window = 5 is not a window of 4 or 6 keys."""
    graph = lower_program(parse_text((ROOT / "specs" / "sliding_window_fwd.tl").read_text(), "sw.tl"),
                          dict(SMALL, Window="5"))
    shapes = Shapes(1, 2, 2, {"seqlen_q": 17, "seqlen_k": 19}, {"scale": 0.37})
    for window in (4, 6):
        ref = (lambda w: lambda Q, K, V, *, scale: sliding_window_attention(Q, K, V, scale=scale, window=w))(window)
        assert not check_interpreter(graph, shapes, reference=ref).ok


def test_an_absent_element_stays_absent_and_an_all_masked_row_is_zero() -> None:
    """Every score of the rows past the window is masked: those rows are 0; rows past seqlen_q are unwritten."""
    text = program("Compute Mask S where q_idx >= 2 and get new S")
    graph = lower_program(parse_text(text, "p.tl"), SMALL)
    Q, K, V = (torch.randn(1, 1, n, 5, dtype=torch.float64) for n in (3, 6, 6))
    from tlc.ir.interpreter import run_program

    O = torch.full((1, 1, 3, 5), float("nan"), dtype=torch.float64)
    out = run_program(graph, {"Q": Q, "K": K, "V": V, "O": O}, {"seqlen_q": 3, "seqlen_k": 6, "scale": 1.0})["O"]
    assert torch.equal(out[0, 0, 2], torch.zeros(5, dtype=torch.float64))
    assert not torch.isnan(out).any() and out[0, 0, :2].abs().sum() > 0


def test_a_predicate_that_divides_by_zero_at_run_time_stops_the_interpreter() -> None:
    from tlc.ir.interpreter import InterpError, run_program

    text = program("Compute Mask S where kv_idx / (seqlen_q - 3) > 0 and get new S")
    graph = lower_program(parse_text(text, "p.tl"), SMALL)
    tensors = {n: torch.zeros(1, 1, 3, 5, dtype=torch.float64) for n in "QKVO"}
    with pytest.raises(InterpError, match="division by zero in 'kv_idx / \\(seqlen_q - 3\\)'"):
        run_program(graph, tensors, {"seqlen_q": 3, "seqlen_k": 3, "scale": 1.0})


def test_tlc_errors_are_one_line_each() -> None:
    with pytest.raises(TlcError) as exc:
        lower_program(parse_text(program("Compute Mask S where kv_idx > n && kv_idx > block_idx"), "p.tl"))
    assert len(exc.value.diagnostics) == 2 and all("\n" not in d.message for d in exc.value.diagnostics)
