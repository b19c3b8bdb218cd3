"""The `mask` pass and the masked-trip analysis with a predicate mask: a predicate that bounds the keys each
row sees (tlc/expr/key_window.py) applies only in partial trips and cuts the empty ones off the loop; one it
cannot read applies in every trip and keeps the loop; a causal mask beside it still cuts at the diagonal.
What these placements mean is checked against the program as written in
tests/property/test_predicate_mask_meaning.py."""
from __future__ import annotations

from pathlib import Path

from tlc.api import lower_source
from tlc.ir.ops import LoopOp, MaskOp
from tlc.passes.base import PassContext
from tlc.passes.mask import MaskPass
from tlc.passes.masked_trips import masked_trip_changes
from tlc.passes.online_softmax import OnlineSoftmaxPass

ROOT = Path(__file__).resolve().parents[2]
MHA = (ROOT / "specs" / "mha_fwd.tl").read_text()
DEFINES = {"HeadDim": "16", "BM": "16", "BN": "8"}
WINDOW = "  Compute Mask S where kv_idx > q_idx || kv_idx < q_idx - 20 and get new S\n"


def masked(extra_masks: str, causal: bool):
    text = MHA.replace("  Compute Softmax S", extra_masks + "  Compute Softmax S")
    graph = lower_source(text, "pm.tl", defines=dict(DEFINES, Causal=str(causal).lower()))
    ctx = PassContext()
    OnlineSoftmaxPass().apply(ctx, graph)
    MaskPass().apply(ctx, graph)
    ctx.sink.raise_if_errors()
    loop = next(op for _, op in graph.walk() if isinstance(op, LoopOp))
    assert loop.body is not None
    return loop, [op for op in loop.body.ops() if isinstance(op, MaskOp)], ctx


def test_a_sliding_window_is_masked_in_partial_trips_and_its_empty_trips_are_cut() -> None:
    loop, masks, ctx = masked(WINDOW, causal=False)
    assert [m.kind for m in masks] == ["predicate", "bounds"]
    window = masks[0]
    # floor((q0 + 1) / BN) and cdiv(q_last + 1, BN), spelled so that no int overflows
    assert str(window.trips()) == ("n >= floor_div(max(block_idx * BM, -1) + 1 - BN, BN) + 1 || "
                                   "n < cdiv(max(min((block_idx + 1) * BM, seqlen_q) - 1 - 20, 0), BN)")
    assert str(loop.start) == "max(0, floor_div(max(block_idx * BM - 20, 0), BN))"
    assert str(loop.stop) == "min(seqlen_k / BN, floor_div(max(min((block_idx + 1) * BM, seqlen_q) - 1, -1), BN) + 1)"
    remark = next(d.message for d in ctx.sink.items if "predicate mask" in d.message)
    assert "full otherwise" in remark and "empty trips cut" in remark


def test_a_causal_mask_beside_it_cuts_the_loop_and_the_predicate_is_placed_too() -> None:
    loop, masks, _ = masked(WINDOW, causal=True)
    kinds = {m.kind: m for m in masks}
    assert set(kinds) == {"causal", "predicate", "bounds"}
    assert kinds["causal"].from_iteration and kinds["predicate"].until_iteration
    assert str(loop.stop).startswith("min(min(seqlen_k / BN, cdiv(")   # the diagonal cut, then the window's
    assert str(loop.start).startswith("max(0, floor_div(")


def test_a_predicate_it_cannot_read_stays_in_every_trip_and_keeps_the_loop() -> None:
    loop, masks, ctx = masked("  Compute Mask S where q_idx / 2 != kv_idx / 2 and get new S\n", causal=False)
    assert masks[0].trips() is None and str(loop.start) == "0" and str(loop.stop) == "seqlen_k / BN"
    assert any("predicate mask in every trip: no term bounds the keys a row sees" in d.message for d in ctx.sink.items)


def test_a_term_it_cannot_read_keeps_the_mask_in_every_trip_but_still_cuts() -> None:
    loop, masks, ctx = masked("  Compute Mask S where kv_idx > q_idx || q_idx == 3 and get new S\n", causal=False)
    assert masks[0].trips() is None                      # a tile may look full and still hold row 3
    assert str(loop.stop).startswith("min(seqlen_k / BN, floor_div(")   # masking more only empties more tiles
    remark = next(d.message for d in ctx.sink.items if "predicate mask" in d.message)
    assert "'q_idx == 3': only comparisons" in remark


def test_empty_trips_stay_when_a_masked_trip_still_changes_the_carried_values() -> None:
    halve = "  Compute Multiply O, 0.5 and get new O\n"
    text = MHA.replace("  Compute Softmax S", WINDOW + "  Compute Softmax S").replace(
        "\n  Compute GEMM P, V and accumulate O\n", "\n  Compute GEMM P, V and accumulate O\n" + halve)
    graph = lower_source(text, "pm.tl", defines=dict(DEFINES, Causal="false"))
    ctx = PassContext()
    MaskPass().apply(ctx, graph)   # online-softmax refuses the halving; the mask pass alone still decides
    loop = next(op for _, op in graph.walk() if isinstance(op, LoopOp))
    assert str(loop.start) == "0"
    assert any("empty trips kept" in d.message for d in ctx.sink.items)


def test_a_predicate_masks_no_trip_whole() -> None:
    """With only a predicate mask, no trip counts as all −inf: the analysis answers that a trip changes the
    carried values; with the causal one taken as masked, the predicate after it keeps them −inf."""
    loop, _, _ = masked(WINDOW, causal=False)
    assert masked_trip_changes(loop, lambda m: m.kind == "causal") is not None
    loop, _, _ = masked(WINDOW, causal=True)
    assert masked_trip_changes(loop, lambda m: m.kind == "causal") is None


def test_the_mask_pass_is_idempotent_on_a_predicate_mask() -> None:
    from tlc.ir.printer import print_graph

    text = MHA.replace("  Compute Softmax S", WINDOW + "  Compute Softmax S")
    graph = lower_source(text, "pm.tl", defines=dict(DEFINES, Causal="true"))
    ctx = PassContext()
    OnlineSoftmaxPass().apply(ctx, graph)
    MaskPass().apply(ctx, graph)
    once = print_graph(graph)
    MaskPass().apply(ctx, graph)
    assert print_graph(graph) == once


def _as_written_equals_after_passes(text: str, sizes) -> None:
    import torch

    from tlc.ir.interpreter import run_program
    from tlc.passes.pipeline import DEFAULT_PIPELINE, run_pipeline
    from tlc.testing.checks import Shapes, make_inputs
    from tlc.testing.structural import output_difference

    written = lower_source(text, "pm.tl")
    built = lower_source(text, "pm.tl")
    run_pipeline(built, DEFAULT_PIPELINE)
    for sq, sk in sizes:
        shapes = Shapes(batch=1, heads=2, kv_heads=2, ints={"seqlen_q": sq, "seqlen_k": sk}, floats={"scale": 0.7})
        tensors, _, scalars = make_inputs(written, shapes, sq * 100 + sk)
        want = run_program(written, tensors, scalars)["O"]
        got = run_program(built, tensors, scalars)["O"]
        why, err = output_difference(got, want)
        assert not why and err <= 1e-9, f"at {sq}x{sk}: {why or err}"
        assert torch.isfinite(got).all()


HALF_TILES = MHA.replace("Param Variant = attention\n", "").replace("(BN, HeadDim)", "(BN / 2, HeadDim)").replace(
    "for n = 0:seqlen_k / BN", "for n = 0:seqlen_k")


def test_a_tile_height_with_a_division_floors_in_the_cut_loop_stop() -> None:
    """`BN / 2` in the key tile floors where it is written; placed in the loop's stop (where `/` rounds up)
    it must stay floored, or trips with visible keys are cut (a window and the causal diagonal alike)."""
    text = HALF_TILES.replace("  Compute Softmax S", "  Compute Mask S where kv_idx > q_idx || kv_idx < q_idx - 2 "
                                                   "and get new S\n  Compute Softmax S")
    text = text.replace("Param HeadDim = 128\nParam BM = 128\nParam BN = 64", "Param HeadDim = 2\nParam BM = 4\nParam BN = 5")
    _as_written_equals_after_passes(text, [(3, 5), (13, 17), (17, 17)])
    causal = text.replace("Param Causal = false", "Param Causal = true")
    _as_written_equals_after_passes(causal, [(3, 5), (13, 17), (17, 17)])


def test_a_bound_that_is_not_an_integer_is_not_read() -> None:
    loop, masks, ctx = masked("  Compute Mask S where kv_idx < q_idx - scale * 8 and get new S\n", causal=False)
    assert masks[0].trips() is None and str(loop.stop) == "seqlen_k / BN"
    assert any("not an integer is not read" in d.message for d in ctx.sink.items)


def test_a_mask_no_softmax_reads_is_refused_at_its_line() -> None:
    """Masking P (after the softmax) would multiply −∞ into P·V, and the key positions past the end, loaded as
    zeros, into NaN; before the scale multiply (an elementwise op between it and the softmax) is fine."""
    import pytest

    from tlc.diagnostics import TlcError
    from tlc.passes.pipeline import DEFAULT_PIPELINE, run_pipeline

    after = MHA.replace("  Compute Softmax S with max m, sum l and get P\n",
                        "  Compute Softmax S with max m, sum l and get P\n  Compute Mask P where kv_idx > q_idx and get new P\n")
    graph = lower_source(after, "pm.tl", defines=DEFINES)
    with pytest.raises(TlcError) as info:
        run_pipeline(graph, DEFAULT_PIPELINE)
    (d,) = [d for d in info.value.diagnostics if d.severity == "error"]
    assert (d.loc.line, d.loc.col) == (43, 3) and "'P' is masked, but no softmax reads it" in d.message
    before = MHA.replace("  Compute Multiply S, scale and get new S\n",
                         "  Compute Mask S where kv_idx > q_idx and get new S\n  Compute Multiply S, scale and get new S\n")
    run_pipeline(lower_source(before, "pm.tl", defines=DEFINES), DEFAULT_PIPELINE)


def test_a_loop_that_may_start_before_the_first_key_tile_starts_at_it() -> None:
    """`for n = st / BN:…` with st an Input that may be negative: the trips before tile 0 hold only absent keys
    (as written they add nothing); a kernel would read before the tensor. The pass starts at max(st / BN, 0)."""
    import torch

    from tlc.ir.interpreter import run_program
    from tlc.passes.mask import _non_negative
    from tlc.passes.pipeline import DEFAULT_PIPELINE, run_pipeline

    text = MHA.replace("Input scale : float\n", "Input scale : float\nInput st : int\n").replace(
        "for n = 0:seqlen_k / BN", "for n = st / BN:seqlen_k / BN")
    written = lower_source(text, "pm.tl", defines=DEFINES)
    built = lower_source(text, "pm.tl", defines=DEFINES)
    run_pipeline(built, DEFAULT_PIPELINE)
    (loop,) = [op for _, op in built.walk() if isinstance(op, LoopOp)]
    assert str(loop.start) == "max(st / BN, 0)"
    g = torch.Generator().manual_seed(3)
    tensors = {n: torch.randn(1, 2, 21 if n == "Q" else 37, 16, generator=g, dtype=torch.float64) for n in "QKV"}
    tensors["O"] = torch.full((1, 2, 21, 16), float("nan"), dtype=torch.float64)
    for st in (-40, -8, -1, 0, 9):
        scalars = {"seqlen_q": 21, "seqlen_k": 37, "scale": 0.3, "st": st}
        want, got = run_program(written, tensors, scalars)["O"], run_program(built, tensors, scalars)["O"]
        assert torch.isfinite(got).all() and (got - want).abs().max().item() < 1e-12, st
    params = {"BM": 16, "Neg": -1}
    from tlc.expr import parse_expr
    assert _non_negative(parse_expr("max(0, block_idx * BM / 8 - 1)"), params)
    assert not _non_negative(parse_expr("block_idx * BM - 1"), params)
    assert not _non_negative(parse_expr("Neg"), params) and not _non_negative(parse_expr("st"), params)
