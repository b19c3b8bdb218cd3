"""`persistent` (sm_90a, `Param Persistent = true`): the warp-specialised kernel loops over its output
tiles. Structure of the kernel IR it leaves (grid, tile loops in both roles, the once-tile's release
and re-arm, the rings' carried position), what it declines and why. NVRTC: tests/nvrtc/test_sm90a_nvrtc.py;
GPU (several tiles per CTA, causal, GQA): tests/gpu/test_sm90a_specs_gpu.py.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tlc.api import compile_graph
from tlc.diagnostics import TlcError
from tlc.kir import ops as K
from tlc.kir import ops_sm90 as H
from tlc.kir.evaluate import evaluate
from tlc.kir.expr import free_names
from tlc.kir.text import parse_kir, print_kir
from tlc.lowering.passes import run_lowering
from tlc.lowering.resources import shared_buffers
from tlc.lowering.sync import effects

SPECS = Path(__file__).resolve().parents[2] / "specs"


def _lower(spec: str = "mha_fwd", arch: str = "sm_90a", **defines: str):
    path = SPECS / f"{spec}.tl"
    graph, _ = compile_graph(path.read_bytes(), str(path), defines={"Persistent": "true", **defines})
    return run_lowering(graph, arch, name=spec)[0]


def _roles(kernel) -> H.WarpSpecializeOp:
    return kernel.body[-1]


def _tile_loop(ops) -> K.ForOp:
    (loop,) = [op for op in ops if isinstance(op, K.ForOp) and op.var == "tile_iter"]
    return loop


@pytest.mark.parametrize("defines", [{}, {"Causal": "true"}, {"HeadDim": "64"}, {"TmaStore": "true"},
                                     {"Stages": "3", "BN": "64", "HeadDim": "64"}])
def test_both_roles_loop_over_the_tiles_with_the_rings_carried(defines: dict) -> None:
    state = _lower(**defines)
    kernel = state.kir.kernels()[0]
    assert str(kernel.grid[0]).startswith("min(") and "launch.ctas" in str(kernel.grid[0])
    assert [str(g) for g in kernel.grid[1:]] == ["1", "1"]
    roles = _roles(kernel)
    producer = _tile_loop(roles.producer[0].body)
    consumer = _tile_loop(roles.consumer)
    for loop in (producer, consumer):
        lets = {op.name: str(op.value) for op in loop.body if isinstance(op, K.LetOp)}
        assert lets["tile"] in ("blockIdx.x + tile_iter * gridDim.x",
                                "select(tile_iter % 2 == 0, blockIdx.x, gridDim.x - 1 - blockIdx.x) + tile_iter * gridDim.x")
        assert "blockIdx" not in lets["block_idx"] and "tile" in lets["block_idx"]
        # every ring position reads the carried counter; the counter advances by the ring loop's trips
        positions = [op for op in K.walk(loop) if isinstance(op, K.LetOp) and re.match(r"n_(stage|phase)", op.name)]
        assert positions and all("ring" in free_names(op.value) for op in positions)
        assert isinstance(loop.body[-1], K.CounterAddOp) and loop.body[-1].counter == "ring"
    assert producer.body[-1].value == consumer.body[-1].value
    # nothing outside the tile loops reads the grid coordinates
    outside = [op for op in kernel.body[:-1] if op.used_names() & {"blockIdx.x", "blockIdx.y", "blockIdx.z"}]
    assert not outside
    # the producer re-arms Q only once the consumers released it (parity of the tile flipped)
    body = list(producer.body)
    wait = next(i for i, op in enumerate(body) if isinstance(op, H.MbarrierWaitOp) and op.bar == "empty_sQ")
    assert isinstance(body[wait + 1], H.MbarrierArriveExpectTxOp) and body[wait + 1].bar == "full_sQ"
    assert str(body[wait].phase) == "1 - tile_iter % 2"
    full = [op for op in consumer.body if isinstance(op, H.MbarrierWaitOp) and op.bar == "full_sQ"]
    assert [str(op.phase) for op in full] == ["tile_iter % 2"]
    assert "persistent: a CTA per resident slot" in "\n".join(state.schedule)
    assert print_kir(parse_kir(print_kir(state.kir))) == print_kir(state.kir)


def _release_index(consumer: K.ForOp) -> int:
    return next(i for i, op in enumerate(consumer.body) if isinstance(op, H.MbarrierArriveOp) and op.bar == "empty_sQ")


def test_the_staging_tile_gets_its_own_bytes_and_q_is_released_after_its_last_gemm() -> None:
    state = _lower()
    kernel = state.kir.kernels()[0]
    buffers = {b.name: b for b in shared_buffers(kernel)}
    q, o = buffers["sQ"], buffers["sO_out"]
    assert o.offset >= q.offset + q.bytes and o.offset % 1024 == 0 and kernel.smem_bytes >= o.offset + o.bytes
    consumer = _tile_loop(_roles(kernel).consumer)
    release = _release_index(consumer)
    assert isinstance(consumer.body[release - 1], H.WgmmaWaitOp) and consumer.body[release - 1].pending == 0
    touches = [i for i, op in enumerate(consumer.body) if any("sQ" in effects(x)[1] for x in K.walk(op))]
    assert touches and max(touches) < release
    later = consumer.body[release + 1:]
    assert any(isinstance(x, K.CopyOp) and "sO_out" in x.writes for op in later for x in K.walk(op))  # the epilogue


def test_where_the_staging_tile_cannot_move_q_is_released_after_the_store() -> None:
    state = _lower(HeadDim="256", BN="64")            # 64 KB of Q + 2 × (32 + 32) KB of K/V: no room for 64 KB of O
    kernel = state.kir.kernels()[0]
    buffers = {b.name: b for b in shared_buffers(kernel)}
    assert buffers["sO_out"].offset == buffers["sQ"].offset
    assert "its tile is released after the store" in "\n".join(state.schedule)
    consumer = _tile_loop(_roles(kernel).consumer)
    release = _release_index(consumer)
    store = max(i for i, op in enumerate(consumer.body) if "sO_out" in effects(op)[1])
    assert store < release


@pytest.mark.parametrize("arch,defines,why", [
    ("sm_90", {}, "the kernel is not warp-specialised"),
    ("sm_90a", {"WarpSpecialize": "false"}, "the kernel is not warp-specialised"),
])
def test_kernels_it_does_not_cover_keep_one_tile_per_cta(arch: str, defines: dict, why: str) -> None:
    state = _lower(arch=arch, **defines)
    assert f"persistent: kept one tile per CTA: {why}" in state.schedule
    assert not any(isinstance(op, K.CounterOp) for op in K.walk(state.kir))
    assert "launch.ctas" not in str(state.kir.kernels()[0].grid[0])


def test_off_by_default_and_a_bad_value_is_one_located_error() -> None:
    path = SPECS / "mha_fwd.tl"
    graph, _ = compile_graph(path.read_bytes(), str(path))
    state, _ = run_lowering(graph, "sm_90a", name="mha_fwd")
    assert not any(isinstance(op, K.CounterOp) for op in K.walk(state.kir))
    text = path.read_text() + "\nParam Persistent = 2"
    graph, _ = compile_graph(text.encode(), str(path))
    with pytest.raises(TlcError, match=re.escape("Param Persistent = 2: use true or false")) as exc:
        run_lowering(graph, "sm_90a", name="mha_fwd")
    (diag,) = exc.value.diagnostics
    assert diag.loc is not None and diag.loc.line == len(text.splitlines())


@pytest.mark.parametrize("causal", [False, True])
def test_tiles_of_uneven_length_are_ordered_query_tile_slowest(causal: bool) -> None:
    """Causal trips depend on the query tile: every head's tile at one query index comes before the
    next index, so each CTA's k-th tile is about as long as every other CTA's (a static round robin
    over x-fastest tiles gave CTAs runs of long or short tiles). Otherwise x stays fastest."""
    state = _lower(Causal=str(causal).lower())
    consumer = _tile_loop(_roles(state.kir.kernels()[0]).consumer)
    lets = {op.name: str(op.value) for op in consumer.body if isinstance(op, K.LetOp)}
    assert lets["head_idx"] == "tile_y" and lets["batch_idx"] == "tile_z"
    if causal:
        assert lets["block_idx"] == "ceil_div(p.seqlen_q, 128) - 1 - tile_x"
        assert lets["tile_x"] == "tile_in_section / tile_heads_here"
        assert lets["tile"].startswith("select(tile_iter % 2 == 0, blockIdx.x, gridDim.x - 1 - blockIdx.x)")
        assert "query tile slowest within sections" in "\n".join(state.schedule)
    else:
        assert lets["tile_x"] == "tile % ceil_div(p.seqlen_q, 128)"
        assert "query tile fastest" in "\n".join(state.schedule)


_LOOPS: dict = {}
_STOPS: dict = {}


def _tile_lets(causal: bool) -> list[K.LetOp]:
    if causal not in _LOOPS:
        loop = _tile_loop(_roles(_lower(Causal=str(causal).lower()).kir.kernels()[0]).consumer)
        _LOOPS[causal] = [op for op in loop.body if isinstance(op, K.LetOp) and op.name.startswith("tile")]
    return _LOOPS[causal]


@settings(max_examples=60, deadline=None)
@given(causal=st.booleans(), sq=st.integers(1, 2000), sk=st.integers(0, 300_000), heads=st.integers(1, 40),
       batch=st.integers(1, 5), ctas=st.integers(1, 300))
def test_every_tile_is_run_once_by_exactly_one_cta(causal, sq, sk, heads, batch, ctas) -> None:
    """The tile loops' coordinates, evaluated as the kernel would for every CTA of the grid, cover the
    one-tile-per-CTA grid exactly once (both orders, sections of any size, a partial last section)."""
    p = {"p.seqlen_q": sq, "p.seqlen_k": sk, "p.heads": heads, "p.batch": batch}
    gx = -(-sq // 128)
    count = gx * heads * batch
    grid = min(count, ctas)
    seen = []
    loop = _tile_loop(_roles(_lower(Causal=str(causal).lower()).kir.kernels()[0]).consumer) if causal not in \
        _STOPS else None
    stop = _STOPS.setdefault(causal, loop.stop if loop is not None else None)
    for cta in range(grid):
        rounds = evaluate(stop, dict(p, **{"blockIdx.x": cta, "gridDim.x": grid}))
        for it in range(rounds):
            env = dict(p, **{"blockIdx.x": cta, "gridDim.x": grid, "tile_iter": it})
            for op in _tile_lets(causal):
                env[op.name] = evaluate(op.value, env)
            assert 0 <= env["tile_x"] < gx and 0 <= env["tile_y"] < heads and 0 <= env["tile_z"] < batch
            seen.append((env["tile_x"], env["tile_y"], env["tile_z"]))
    assert len(seen) == count and len(set(seen)) == count
