"""Hypothesis: every pass of the TL pipeline keeps the interpreter's result, on every spec
under -D variations (tile sizes, head dims, causal and its alignment), at random small
sequence lengths (1 and non-multiples of the tiles included), and on the broken variants
the repairs fix (a deleted Reshape, a dropped or superfluous `.T`): once repaired, the
program computes what the original computes, and its layouts check."""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spec_variants import SPECS, VARIANTS, available_pipeline, lower, make_variant, small_defines
from tlc.ir.interpreter import run_program
from tlc.ir.printer import print_graph
from tlc.passes.base import PassContext
from tlc.passes.pipeline import parse_pipeline
from tlc.testing.checks import Shapes, make_inputs

PIPELINE = available_pipeline()
VARIANT_PAIRS = [(spec, kind) for spec in SPECS for kind in VARIANTS if make_variant(spec, kind) is not None]


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Tiles here are tiny: torch's intra-op threads only add sync cost (2-3x slower on 2 cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@st.composite
def programs(draw):
    spec, kind = draw(st.sampled_from(VARIANT_PAIRS))
    choice = {
        "BM": draw(st.sampled_from([8, 16])), "BN": draw(st.sampled_from([8, 16])),
        "HeadDim": draw(st.sampled_from([8, 16])), "DQK": draw(st.sampled_from([8, 24])),
        "DV": draw(st.sampled_from([8, 16])), "K1": draw(st.sampled_from([8, 16])),
        "N2": draw(st.sampled_from([8, 16])), "Causal": draw(st.booleans()),
        "Align": draw(st.sampled_from(["top_left", "bottom_right"])),
    }
    sq = draw(st.one_of(st.just(1), st.integers(1, 37)))
    sk = draw(st.one_of(st.just(1), st.integers(1, 37)))
    heads = draw(st.sampled_from([1, 2]))
    seed = draw(st.integers(0, 1 << 16))
    return spec, kind, small_defines(spec, choice), (sq, sk, heads), seed


def _inputs(graph, sq: int, sk: int, heads: int, seed: int, b2b: bool):
    shapes = Shapes(heads=heads, kv_heads=heads if b2b else 1, ints={"seqlen_q": sq, "seqlen_k": sk})
    if "scale" in graph.inputs:
        shapes.floats["scale"] = 0.3
    tensors, _, scalars = make_inputs(graph, shapes, seed)
    return tensors, scalars


def _close(got: torch.Tensor, want: torch.Tensor) -> bool:
    return bool(torch.isfinite(got).all()) and float((got - want).abs().max()) <= 1e-9 * max(1.0, float(want.abs().max()))


def _meaning(graph) -> list[tuple]:
    """What the interpreter reads: ops, attributes and value names, not the types
    (which only infer-shapes changes and the interpreter never looks at)."""
    out = []
    for _, op in graph.walk():
        attrs = tuple((k, str(v)) for k, v in op.attrs().items() if k != "body")
        names = tuple(v.name for v in (*op.results, *op.operands, *getattr(op, "yields", ())))
        out.append((op.mnemonic, attrs, names))
    return out


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_every_pass_keeps_the_interpreters_result(case) -> None:
    spec, kind, defines, (sq, sk, heads), seed = case
    variant = make_variant(spec, kind)
    original = make_variant(spec, "orig")
    assert variant is not None and original is not None
    reference = lower(original.text, spec.stem, defines)
    tensors, scalars = _inputs(reference, sq, sk, heads, seed, "b2b" in spec.stem)
    want = run_program(reference, tensors, scalars)["O"]

    graph = lower(variant.text, spec.stem, defines)
    # The interpreter ignores fragment roles, so only a wrong `.T` changes the value.
    meaning_ok = "_T" not in kind
    if meaning_ok and kind != "orig":
        assert _close(run_program(graph, tensors, scalars)["O"], want), "the lowered program is already wrong"
    ctx, checked, layouts = PassContext(), _meaning(graph) if meaning_ok else None, False
    for p in parse_pipeline(",".join(PIPELINE)):
        p.apply(ctx, graph)
        assert not ctx.sink.errors, [d.render() for d in ctx.sink.errors]
        meaning_ok = meaning_ok or p.name == "resolve-transpose"
        layouts = layouts or p.name == "insert-reshape"
        now = _meaning(graph)
        if meaning_ok and now != checked:
            out = run_program(graph, tensors, scalars, check_layouts=layouts)["O"]
            assert _close(out, want), f"after {p.name}: {float((out - want).abs().max())}"
            checked = now
    assert meaning_ok and layouts
    run_program(graph, tensors, scalars, check_layouts=True)  # the repaired layouts hold
