"""mask: the KV loop is cut at the diagonal, masks run only on boundary tiles, loads
zero-fill and the scores get an explicit bounds mask — all without changing the
interpreter's result (hypothesis), fully masked rows stay 0, and the pass is idempotent."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from softmax_props import apply, cases, interpret, keeps_meaning, lower
from tlc.frontend.ast import eval_expr
from tlc.ir.ops import CopyOp, LoopOp, MaskOp
from tlc.ir.printer import print_graph
from tlc.passes.base import PassContext
from tlc.passes.mask import MaskPass
from tlc.passes.online_softmax import OnlineSoftmaxPass
from tlc.testing.checks import Shapes
from tests.spec_files import ONE_KERNEL_SPECS

ROOT = Path(__file__).resolve().parents[2]
MHA = (ROOT / "specs" / "mha_fwd.tl").read_text()
ONLINE, MASK = OnlineSoftmaxPass(), MaskPass()


def nothing(graph) -> None:
    pass


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(), st.booleans())
def test_keeps_meaning(case, online_first: bool) -> None:
    """After online-softmax (the pipeline's order) and also on a domain softmax."""
    program, sh, seed = case
    before = apply(ONLINE) if online_first else nothing
    outcome = keeps_meaning(program.render(), before, apply(MASK), sh, seed)
    assert outcome, outcome.why


def masked(align: str = "top_left", causal: bool = True, **defines):
    defs = {"HeadDim": "16", "BM": "16", "BN": "8", "Causal": str(causal).lower(), "Align": align}
    defs.update({k: str(v) for k, v in defines.items()})
    g = lower(MHA, defs)
    ctx = PassContext()
    ONLINE.apply(ctx, g)
    MASK.apply(ctx, g)
    ctx.sink.raise_if_errors()
    return g, ctx, defs


def the_loop(g) -> LoopOp:
    return next(op for _, op in g.walk() if isinstance(op, LoopOp))


def trips(loop: LoopOp, **env) -> int:
    return int(eval_expr(loop.stop, env, ceil_div=True)) - int(eval_expr(loop.start, env))


def test_causal_top_left_cut_and_boundary_tiles() -> None:
    g, ctx, _ = masked()
    loop = the_loop(g)
    assert str(loop.stop) == "min(seqlen_k / BN, cdiv(min((block_idx + 1) * BM, seqlen_q), BN))"
    causal = next(op for op in loop.body.ops() if isinstance(op, MaskOp) and op.kind == "causal")
    assert [(v, str(e)) for v, e in causal.from_iteration] == [("n", "(block_idx * BM + 1) / BN")]
    bounds = next(op for op in loop.body.ops() if isinstance(op, MaskOp) and op.kind == "bounds")
    assert str(bounds.limit) == "seqlen_k" and str(bounds.from_iteration[0][1]) == "seqlen_k / BN"
    env = dict(BM=16, BN=8, seqlen_q=64, seqlen_k=64)
    assert [trips(loop, block_idx=b, **env) for b in range(4)] == [2, 4, 6, 8]
    assert trips(loop, block_idx=1, **dict(env, seqlen_q=20)) == 3  # rows past seqlen_q need no keys
    lines = {d.loc.line for d in ctx.sink.items if "causal" in d.message}
    assert lines == {41}


def test_bottom_right_shifts_cut_and_first_masked_tile() -> None:
    g, _, _ = masked("bottom_right")
    loop = the_loop(g)
    env = dict(BM=16, BN=8, seqlen_q=17, seqlen_k=40)  # shift 23
    assert [trips(loop, block_idx=b, **env) for b in range(2)] == [5, 5]
    env = dict(BM=16, BN=8, seqlen_q=40, seqlen_k=17)  # shift -23: block 0 sees no key
    assert [trips(loop, block_idx=b, **env) for b in range(3)] == [0, 2, 3]


def test_loads_zero_fill_and_scores_are_bounds_masked() -> None:
    g, ctx, _ = masked(causal=False)
    loads = [op for _, op in g.walk() if isinstance(op, CopyOp) and op.src_space == "global"]
    assert {op.operands[0].base: op.oob for op in loads} == {"Q": "zero", "K": "zero", "V": "zero"}
    loop = the_loop(g)
    assert str(loop.stop) == "seqlen_k / BN"  # no causal mask: no cut
    assert not any(op.kind == "causal" for op in loop.body.ops() if isinstance(op, MaskOp))
    assert any("bounds" in d.message and d.loc.line == 42 for d in ctx.sink.items)


@pytest.mark.parametrize("sq,sk", [(31, 17), (17, 1), (64, 1), (40, 17)])
def test_fully_masked_rows_are_zero_not_nan(sq: int, sk: int) -> None:
    g, _, defs = masked("bottom_right")
    sh = Shapes(1, 2, 2, {"seqlen_q": sq, "seqlen_k": sk}, {"scale": 0.5})
    out, ref = interpret(g, sh, 7)
    assert not torch.isnan(out).any()
    assert torch.equal(out[:, :, : sq - sk], torch.zeros_like(out[:, :, : sq - sk]))
    assert torch.allclose(out, ref, rtol=0, atol=1e-12)


def test_idempotent_on_every_spec() -> None:
    for spec in ONE_KERNEL_SPECS:
        switched = "\nParam Causal" in spec.read_text()   # sliding_window_fwd.tl says which keys a row sees itself
        for defines in ({"Causal": "true"}, {"Causal": "false"}) if switched else ({},):
            g = lower(spec.read_text(), defines)
            ctx = PassContext()
            ONLINE.apply(ctx, g)
            MASK.apply(ctx, g)
            once = print_graph(g)
            MASK.apply(ctx, g)
            assert print_graph(g) == once, spec.name


def test_domain_softmax_keeps_its_bound() -> None:
    g = lower(MHA, {"Causal": "true", "HeadDim": "16", "BM": "16", "BN": "8"})
    ctx = PassContext()
    MASK.apply(ctx, g)
    assert str(the_loop(g).stop) == "seqlen_k / BN"
    assert any("loop bound kept" in d.message for d in ctx.sink.items)
    sh = Shapes(1, 1, 1, {"seqlen_q": 31, "seqlen_k": 17}, {"scale": 0.5})
    defs = {"Causal": "true", "HeadDim": "16", "BM": "16", "BN": "8"}
    assert keeps_meaning(MHA, nothing, apply(MASK), sh, 1, defines=defs)


def test_b2b_gemm_has_no_scores_and_is_left_alone() -> None:
    text = (ROOT / "specs" / "b2b_gemm_relu.tl").read_text()
    g = lower(text)
    before = print_graph(g)
    MASK.apply(PassContext(), g)
    assert print_graph(g) == before


def test_final_ir_round_trips_through_the_ir_parser() -> None:
    from tlc.ir.irparser import parse_ir

    g, _, _ = masked("bottom_right")
    text = print_graph(g)
    again = parse_ir(text)
    assert print_graph(again) == text
    sh = Shapes(1, 1, 1, {"seqlen_q": 31, "seqlen_k": 17}, {"scale": 0.5})
    assert torch.equal(interpret(again, sh, 2)[0], interpret(g, sh, 2)[0])
