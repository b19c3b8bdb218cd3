"""The `mask` pass and the masked-trip analysis with a predicate mask: the predicate applies in every trip
(no `from_iteration`), never cuts the loop, and a trip is not taken as all-masked because of it; a causal
mask beside it still cuts the loop at the diagonal and is applied from its first crossing trip only."""
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


def test_a_predicate_mask_alone_stays_in_every_trip_and_keeps_the_loop_bound() -> None:
    loop, masks, _ = masked(WINDOW, causal=False)
    assert [(m.kind, m.from_iteration) for m in masks][0] == ("predicate", ())
    assert [m.kind for m in masks] == ["predicate", "bounds"]
    assert str(loop.stop) == "seqlen_k / BN"


def test_a_causal_mask_beside_it_cuts_the_loop_and_the_predicate_stays_whole() -> None:
    loop, masks, _ = masked(WINDOW, causal=True)
    kinds = {m.kind: m for m in masks}
    assert set(kinds) == {"causal", "predicate", "bounds"}
    assert kinds["causal"].from_iteration and not kinds["predicate"].from_iteration
    assert str(loop.stop).startswith("min(seqlen_k / BN, cdiv(")   # the diagonal cut


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
