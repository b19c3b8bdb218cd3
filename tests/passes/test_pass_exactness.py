"""The TL passes keep what a program means or refuse it at its line: programs off FlashAttention's exact
shape (an op on P before P·V, an accumulator that starts non-zero or is changed in the loop, a query tile
stored at other rows than it was loaded from, trips whose keys lie past the end) are interpreted as written
and after the pipeline, on NaN-poisoned outputs, and must agree in value and in which elements are written."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tlc.api import compile_graph
from tlc.diagnostics import TlcError
from tlc.ir.interpreter import run_program
from tlc.testing.checks import Shapes, make_inputs

MHA = (Path(__file__).resolve().parents[2] / "specs" / "mha_fwd.tl").read_text()
SMALL = {"HeadDim": "8", "BM": "8", "BN": "8"}
SIZES = [(1, 1), (17, 33), (1, 65), (9, 8), (33, 100)]
PV = "\n  Compute GEMM P, V and accumulate O\n"   # the statement, not the sketch in the comments
RESHAPE = "  Reshape P from"
LOOP = "for n = 0:seqlen_k / BN\n"


def _sub(old: str, new: str) -> str:
    assert old in MHA, old
    return MHA.replace(old, new, 1)


def _outputs(text: str, passes: bool, sq: int, sk: int) -> torch.Tensor:
    graph, _ = compile_graph(text.encode(), "case.tl", defines=SMALL, run_passes=passes)
    shapes = Shapes(1, 2, 1, {"seqlen_q": sq, "seqlen_k": sk}, {"scale": 0.3})
    tensors, _, scalars = make_inputs(graph, shapes, seed=sq * 100 + sk)
    return run_program(graph, tensors, scalars)["O"]


def _same_meaning(text: str) -> None:
    for sq, sk in SIZES:
        want, got = _outputs(text, False, sq, sk), _outputs(text, True, sq, sk)
        assert torch.equal(torch.isnan(want), torch.isnan(got)), f"{sq}x{sk}: other elements written"
        ok = ~torch.isnan(want)
        if ok.any():
            err = float((want[ok] - got[ok]).abs().max()) / max(1.0, float(want[ok].abs().max()))
            assert err < 1e-12, f"{sq}x{sk}: {err}"


def _refused_at(text: str, line_text: str, words: str) -> None:
    with pytest.raises(TlcError) as exc:
        compile_graph(text.encode(), "case.tl", defines=SMALL)
    diag = exc.value.diagnostics[0]
    assert diag.loc is not None and line_text in text.splitlines()[diag.loc.line - 1], diag.render()
    assert words in diag.message, diag.message


# name → program text that the pipeline must keep exactly
KEPT = {
    "p_times_half": _sub(RESHAPE, "  Compute Multiply P, 0.5 and get new P\n" + RESHAPE),
    "p_divided_by_scale": _sub(RESHAPE, "  Compute Divide P, scale and get new P\n" + RESHAPE),
    "p_relu": _sub(RESHAPE, "  Compute Relu P and get new P\n" + RESHAPE),
    "o_halved_each_trip": _sub(PV, PV + "  Compute Multiply O, 0.5 and get new O\n"),
    "o_divided_by_l_plus_1": _sub("Compute Divide O, l and get new O\n",
                                  "Compute Add l, 1.0 and get l2\nCompute Divide O, l2 and get new O\n"),
    # a trip whose K/V tiles lie wholly past seqlen_k adds nothing, as absent keys do
    "one_trip_past_the_keys": _sub(LOOP, "for n = 0:seqlen_k / BN + 1\n"),
    "kv_one_tile_ahead": MHA.replace("in coordinate [L = n]", "in coordinate [L = n + 1]"),
    # at 1x1 and 9x8 the loop runs no trip: an empty domain, m = -inf and l = 0, O / l = 0 (LANGUAGE.md §7)
    "loop_from_1": _sub(LOOP, "for n = 1:seqlen_k / BN\n"),
    # causal: the trips past the diagonal still halve O, so the loop is not cut there
    "o_halved_each_trip_causal": _sub(PV, PV + "  Compute Multiply O, 0.5 and get new O\n").replace(
        "Param Causal = false", "Param Causal = true"),
    "causal_bottom_right": MHA.replace("Param Causal = false", "Param Causal = true").replace(
        "Param Align = top_left", "Param Align = bottom_right"),
}


@pytest.mark.parametrize("name", sorted(KEPT))
def test_pipeline_keeps_the_meaning(name: str) -> None:
    _same_meaning(KEPT[name])


@pytest.mark.parametrize("op", ["Square", "Exp", "Sqrt", "Tanh"])
def test_a_nonlinear_op_on_p_is_refused_at_its_line(op: str) -> None:
    line = f"  Compute {op} P and get new P"
    _refused_at(_sub(RESHAPE, line + "\n" + RESHAPE), line.strip(), "not exact in the online form")


def test_adding_to_p_is_refused() -> None:
    line = "  Compute Add P, 0.1 and get new P"
    _refused_at(_sub(RESHAPE, line + "\n" + RESHAPE), line.strip(), "not exact in the online form")


def test_an_accumulator_that_starts_non_zero_is_refused() -> None:
    text = _sub(LOOP, "Compute Add O, 0.5 and get new O\n" + LOOP)
    _refused_at(text, "accumulate O", "holds a value from before the loop")


def test_adding_to_the_accumulator_in_the_loop_is_refused() -> None:
    _refused_at(_sub(PV, PV + "  Compute Add O, 0.5 and get new O\n"), "accumulate O", "'Add' on the accumulator")


def test_p_squared_through_two_operands_is_refused() -> None:
    text = _sub(RESHAPE, "  Compute Multiply P, P and get new P\n" + RESHAPE)
    _refused_at(text, "Multiply P, P", "not exact in the online form")


def test_query_rows_from_the_end_stored_from_the_top_are_refused_at_the_store() -> None:
    text = _sub("Copy Q (BM, HeadDim) in coordinate [L = block_idx]",
                "Copy Q (BM, HeadDim) in coordinate [L = block_idx from end]")
    _refused_at(text, "Copy O (BM, HeadDim)", "rows come from 'Q' loaded at")


def test_the_same_rows_written_differently_are_not_refused() -> None:
    """`128` and `BM = 128` are the same tile height: the check compares values, not spellings."""
    text = _sub("Copy O (BM, HeadDim) in coordinate [L = block_idx]", "Copy O (8, HeadDim) in coordinate [L = block_idx]")
    _same_meaning(text)


def test_a_trip_without_keys_leaves_the_row_written() -> None:
    """As written: a trip whose keys are all past the end adds nothing to O (specs/LANGUAGE.md: absent
    elements contribute nothing to a GEMM's sum), so every in-range output row is written."""
    out = _outputs(KEPT["one_trip_past_the_keys"], False, 17, 33)
    assert not torch.isnan(out).any()


def test_a_gemm_chain_stored_at_other_rows_than_its_a_tile_is_refused() -> None:
    """The same rule without a softmax: relu(A·B)·C with A's tiles counted from the end, O stored from the top."""
    text = (Path(__file__).resolve().parents[2] / "specs" / "b2b_gemm_relu.tl").read_text().replace(
        "Copy A (BM, K1) in coordinate [L = block_idx] from global", "Copy A (BM, K1) in coordinate [L = block_idx from end] from global")
    assert "from end" in text
    with pytest.raises(TlcError) as exc:
        compile_graph(text.encode(), "b2b.tl")
    diag = exc.value.diagnostics[0]
    assert "rows come from 'A' loaded at" in diag.message and "Copy O" in text.splitlines()[diag.loc.line - 1]
