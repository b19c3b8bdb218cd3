"""`l2-sections` (sm_90a, causal, one tile per CTA): the 1-D grid's decode is a bijection onto the
tiles, each section's heads' K/V fits the L2 budget, each section runs its query tiles longest first,
and in bench/tail_model.py's list-scheduling model of the hardware's in-order CTA dispatch it ends the bar's
causal grids within 2 % of an even spread where the x-fastest order did not; `L2TailOnly` keeps the hardware's order
up to the last section. GPU: tests/gpu/test_sm90a_specs_gpu.py."""
from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.tail_model import GRIDS, decode, lower, over_even, ring, trips
from bench.tail_model import lower_state as _lower
from tlc.api import compile_graph
from tlc.diagnostics import TlcError
from tlc.kir import ops as K
from tlc.kir import ops_sm90 as H
from tlc.kir.evaluate import evaluate
from tlc.kir.expr import free_names
from tlc.kir.text import parse_kir, print_kir
from tlc.kir.transforms.attention.l2_sections import L2_BUDGET
from tlc.lowering.passes import run_lowering

SPECS = Path(__file__).resolve().parents[2] / "specs"
CAUSAL_128 = dict(HeadDim="128", BM="128", BN="128", Warps="8", Causal="true", L2Sections="true")


def test_causal_kernels_take_a_one_dimensional_grid_of_every_tile() -> None:
    state = _lower(**CAUSAL_128)
    kernel = state.kir.kernels()[0]
    assert [str(g) for g in kernel.grid] == ["ceil_div(p.seqlen_q, 128) * (p.heads * p.batch)", "1", "1"]
    lets = {op.name: op for op in kernel.body if isinstance(op, K.LetOp)}
    assert str(lets["block_idx"].value) == "l2_x" and str(lets["head_idx"].value) == "l2_y"
    # only the decode reads the hardware's block index; nothing reads blockIdx.y/z or gridDim any more
    readers = {op.name for op in K.walk(kernel) if isinstance(op, K.LetOp) and "blockIdx.x" in free_names(op.value)}
    assert readers == {"l2_sec", "l2_r"}
    assert not [op for op in K.walk(kernel) if op.used_names() & {"blockIdx.y", "blockIdx.z", "gridDim.x"}]
    assert any("l2-sections: the" in n for n in state.schedule)
    assert print_kir(parse_kir(print_kir(state.kir))) == print_kir(state.kir)


@pytest.mark.parametrize("defines,why", [
    (dict(CAUSAL_128, Causal="false"), "no causal mask"),
    (dict(CAUSAL_128, Persistent="true"), "a 1-D grid"),
    (dict(CAUSAL_128, L2Sections="false"), None),
    ({k: v for k, v in CAUSAL_128.items() if k != "L2Sections"}, None)])   # off unless asked for
def test_other_kernels_keep_the_hardware_order(defines, why) -> None:
    state = _lower(**defines)
    kernel = state.kir.kernels()[0]
    assert "l2_x" not in {op.name for op in kernel.body if isinstance(op, K.LetOp)}
    notes = "\n".join(state.schedule)
    assert (f"l2-sections: kept the hardware's order: {why}" in notes) if why else "l2-sections" not in notes


def _trip_bytes(kernel) -> int:
    return sum(y.bytes for y in K.walk(ring(kernel)) if isinstance(y, H.MbarrierArriveExpectTxOp))


@pytest.mark.parametrize("knob,needed", [("L2TailOnly", "L2Sections"), ("StaticTiles", "Persistent")])
def test_a_refinement_without_its_knob_is_refused_at_its_param_line(tmp_path, knob, needed) -> None:
    """`L2TailOnly` alone (or `StaticTiles` without `Persistent`) would change nothing: one located line."""
    path = tmp_path / "refine.tl"
    path.write_text((SPECS / "gqa_fwd.tl").read_text() + f"\nParam {knob} = true\n")
    graph, _ = compile_graph(path.read_bytes(), str(path), defines=dict(CAUSAL_128, L2Sections="false"))
    with pytest.raises(TlcError) as err:
        run_lowering(graph, "sm_90a", name="gqa_fwd")
    line = len((SPECS / "gqa_fwd.tl").read_text().splitlines()) + 2
    message = err.value.render()
    assert f"refine.tl:{line}:1: error: {knob} = true needs {needed} = true" in message
    assert "Traceback" not in message


def test_tlc_attention_asks_for_it_at_d_256_causal_only() -> None:
    from tlc.attention.kernels import attention_spec

    for d, dv in ((64, 64), (128, 128), (256, 256), (224, 224), (192, 128)):
        for causal in (False, True):
            for arch in ("sm_90", "sm_90a"):
                want = causal and arch == "sm_90a" and d >= 224
                assert attention_spec("bf16", d, dv, causal, arch)[1].get("L2Sections", False) is want, (d, causal, arch)


SHAPES = dict(sq=st.integers(1, 5000), sk_extra=st.integers(0, 3000), heads=st.integers(1, 40),
              batch=st.integers(1, 5), spec=st.sampled_from(["gqa", "mla"]))


def _decode_all(kernel, sq: int, sk_extra: int, heads: int, batch: int) -> tuple[dict, int, list[dict], list]:
    """(env, gx, each tile number's decode, its (x, y, z)), having checked the decode is a bijection."""
    env = {"p.seqlen_q": sq, "p.seqlen_k": sq + sk_extra, "p.heads": heads, "p.batch": batch, "p.group": 1}
    gx = evaluate(kernel.grid[0], env) // (heads * batch)
    decoded = [decode(kernel, env, t) for t in range(gx * heads * batch)]
    tiles = [(d["l2_x"], d["l2_y"], d["l2_z"]) for d in decoded]
    assert sorted(tiles) == [(x, y, z) for x in range(gx) for y in range(heads) for z in range(batch)]
    return env, gx, decoded, tiles


@settings(max_examples=40, deadline=None)
@given(**SHAPES)
def test_the_decode_is_a_bijection_with_sections_that_fit_l2_longest_first(sq, sk_extra, heads, batch, spec) -> None:
    kernel = _KERNELS[spec]
    env, gx, decoded, tiles = _decode_all(kernel, sq, sk_extra, heads, batch)
    trip_counts = [trips(kernel, env, t) for t in range(len(tiles))]
    sec_heads = decoded[0]["l2_heads"]
    assert sec_heads == 1 or sec_heads * max(trip_counts) * _trip_bytes(kernel) <= L2_BUDGET
    sections: dict[int, set] = {}
    for d, (x, y, z) in zip(decoded, tiles):
        sections.setdefault(d["l2_sec"], set()).add((y, z))
    assert all(len(heads_of) <= sec_heads for heads_of in sections.values())
    assert sum(len(h) for h in sections.values()) == heads * batch   # a head lies in one section
    for t in range(len(tiles) - 1):                                  # longest first within a section
        if decoded[t]["l2_sec"] == decoded[t + 1]["l2_sec"]:
            assert trip_counts[t + 1] <= trip_counts[t]


@settings(max_examples=30, deadline=None)
@given(**SHAPES)
def test_tail_only_keeps_the_hardware_order_until_the_last_section(sq, sk_extra, heads, batch, spec) -> None:
    kernel = _TAIL_KERNELS[spec]
    env, gx, decoded, tiles = _decode_all(kernel, sq, sk_extra, heads, batch)
    front = (heads * batch - decoded[0]["l2_fit"]) * gx
    assert tiles[:front] == [(t % gx, t // gx % heads, t // gx // heads) for t in range(front)]   # as launched
    tail = [trips(kernel, env, t) for t in range(front, len(tiles))]
    assert tail == sorted(tail, reverse=True)                        # the last section: longest first


@pytest.mark.parametrize("name,sq,heads,batch,defines", GRIDS, ids=[g[0] for g in GRIDS])
def test_the_order_ends_within_two_percent_of_an_even_spread(name, sq, heads, batch, defines) -> None:
    """bench/tail_model.py: list scheduling of the blocks in launch order, a tile costing its ring trips + 1."""
    bm = int(defines["BM"])
    x_fastest = over_even(lower(**defines), sq, heads, batch, bm)
    sections = over_even(lower(**defines, L2Sections="true"), sq, heads, batch, bm)
    tail_only = over_even(lower(**defines, L2Sections="true", L2TailOnly="true"), sq, heads, batch, bm)
    assert sections < 1.02 and x_fastest > 1.03, (name, sections, x_fastest)
    assert tail_only < (1.05 if "d=256" in name else 1.02), (name, tail_only)


_TAIL_KERNELS = {"gqa": _lower(**CAUSAL_128, L2TailOnly="true").kir.kernels()[0],
                 "mla": _lower("mla_prefill_fwd", DQK="192", DV="128", BM="128", BN="128", Warps="8", Causal="true",
                               Align="top_left", L2Sections="true", L2TailOnly="true").kir.kernels()[0]}
_KERNELS = {"gqa": _lower(**CAUSAL_128).kir.kernels()[0],
            "mla": _lower("mla_prefill_fwd", DQK="192", DV="128", BM="128", BN="128", Warps="8", Causal="true",
                          Align="top_left", L2Sections="true").kir.kernels()[0]}
