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
def test_both_roles_loop_over_the_tiles_the_producer_draws(defines: dict) -> None:
    state = _lower(**defines)
    program = state.kir
    kernel = program.kernels()[0]
    assert str(kernel.grid[0]).startswith("min(") and "launch.ctas" in str(kernel.grid[0])
    assert [str(g) for g in kernel.grid[1:]] == ["1", "1"]
    (params,) = [op for op in program.body if isinstance(op, H.TmaParamsOp)]
    assert params.fields[-1] == (H.TILE_COUNTER, "ptr<i32>")
    roles = _roles(kernel)
    producer = _tile_loop(roles.producer[0].body)
    consumer = _tile_loop(roles.consumer)
    count = "ceil_div(p.seqlen_q, 128) * p.heads * p.batch"
    # the producer: its first tile is blockIdx.x, each next one drawn from the counter; past the end it
    # hands the consumers the end (after they released the last Q) and stops
    assert [str(op.init) for op in roles.producer[0].body if isinstance(op, K.CounterOp) and op.name == "tile"] \
        == ["blockIdx.x"]
    end = producer.body[0]
    assert isinstance(end, K.IfOp) and str(end.cond) == f"tile >= {count}"
    assert [type(op) for op in end.body] == [H.MbarrierWaitOp, H.TileSlotStoreOp, H.MbarrierArriveOp, K.BreakOp]
    draws = [op for op in producer.body if isinstance(op, H.AtomicAddOp)]
    assert len(draws) == 1 and str(draws[0].ptr) == f"p.{H.TILE_COUNTER}"
    assert isinstance(producer.body[-1], K.CounterSetOp) and str(producer.body[-1].value) == "tile_next + gridDim.x"
    body = list(producer.body)
    wait = next(i for i, op in enumerate(body) if isinstance(op, H.MbarrierWaitOp) and op.bar == "empty_sQ")
    assert isinstance(body[wait + 1], H.TileSlotStoreOp) and isinstance(body[wait + 2], H.MbarrierArriveExpectTxOp)
    assert body[wait + 2].bar == "full_sQ" and str(body[wait].phase) == "1 - tile_iter % 2"
    # the consumers: wait for Q's barrier, read the tile's number, stop at the end
    head = consumer.body[:3]
    assert isinstance(head[0], H.MbarrierWaitOp) and head[0].bar == "full_sQ" and str(head[0].phase) == "tile_iter % 2"
    assert isinstance(head[1], H.TileSlotLoadOp) and head[1].name == "tile"
    assert isinstance(head[2], K.IfOp) and str(head[2].cond) == f"tile >= {count}"
    assert [op for op in K.walk(consumer) if isinstance(op, H.MbarrierWaitOp) and op.bar == "full_sQ"] == [head[0]]
    for loop in (producer, consumer):
        lets = {op.name: str(op.value) for op in loop.body if isinstance(op, K.LetOp)}
        assert lets["tile_x"] == "tile % ceil_div(p.seqlen_q, 128)"     # x fastest, as the hardware launches
        assert "blockIdx" not in lets["block_idx"] and "tile_x" in lets["block_idx"]
        # every ring position reads the carried counter; the counter advances by the ring loop's trips
        positions = [op for op in K.walk(loop) if isinstance(op, K.LetOp) and re.match(r"n_(stage|phase)", op.name)]
        assert positions and all("ring" in free_names(op.value) for op in positions)
        (advance,) = [op for op in loop.body if isinstance(op, K.CounterAddOp)]
        assert advance.counter == "ring"
    assert [op.value for op in producer.body if isinstance(op, K.CounterAddOp)] == \
        [op.value for op in consumer.body if isinstance(op, K.CounterAddOp)]
    # nothing outside the tile loops reads the grid coordinates
    outside = [op for op in kernel.body[:-1] if op.used_names() & {"blockIdx.x", "blockIdx.y", "blockIdx.z"}]
    assert not outside
    assert "persistent: a CTA per resident slot" in "\n".join(state.schedule)
    assert print_kir(parse_kir(print_kir(program))) == print_kir(program)


@pytest.mark.parametrize("spec,defines", [("mha_fwd", {}), ("gqa_fwd", {"Causal": "true", "Warps": "8", "BN": "128"})])
def test_static_tiles_step_by_the_grid_without_the_counter(spec: str, defines: dict) -> None:
    """`Param StaticTiles = true`: the producer's next tile is its tile + gridDim.x (no atomicAdd), so its
    TMA coordinates derive from blockIdx and gridDim alone; the consumers still read the number it hands over."""
    state = _lower(spec, StaticTiles="true", **defines)
    roles = _roles(state.kir.kernels()[0])
    producer = _tile_loop(roles.producer[0].body)
    assert not [op for op in K.walk(producer) if isinstance(op, H.AtomicAddOp)]
    (params,) = [op for op in state.kir.body if isinstance(op, H.TmaParamsOp)]
    assert H.TILE_COUNTER not in dict(params.fields)   # no counter for the launcher to zero
    assert isinstance(producer.body[-1], K.CounterSetOp) and str(producer.body[-1].value) == "tile + gridDim.x"
    assert "tile_next" not in {n for op in K.walk(producer) for n in op.used_names()}
    consumer = _tile_loop(roles.consumer)
    assert isinstance(consumer.body[1], H.TileSlotLoadOp)
    assert "takes every gridDim.x-th tile from blockIdx.x on (Param StaticTiles" in "\n".join(state.schedule)
    assert print_kir(parse_kir(print_kir(state.kir))) == print_kir(state.kir)


def _static_order(causal: bool) -> dict:
    state = _lower("gqa_fwd", StaticTiles="true", HeadDim="64", BM="192", BN="128", Warps="12",
                   Causal=str(causal).lower())
    loop = _tile_loop(_roles(state.kir.kernels()[0]).consumer)
    return {op.name: op.value for op in loop.body if isinstance(op, K.LetOp) and op.name.startswith("tile_")}


def test_static_causal_tiles_number_the_heads_fastest_so_each_cta_sweeps_the_tile_lengths() -> None:
    """x fastest, CTA b of 132 takes query tile b % 22 of every head at S = 4096 on 192-row tiles (22 per
    head, 6 x 22 = 132), so the CTAs holding the long causal tiles hold all of them (0.61x on an H200,
    docs/hopper.md). Numbered heads fastest, each CTA's tiles span the lengths: the busiest CTA's causal
    work (KV trips, the query tiles counted from the end) is 1.03x the mean here, against 2.0x."""
    causal, plain = _static_order(True), _static_order(False)
    assert [str(causal[k]) for k in ("tile_x", "tile_y", "tile_z")] == [
        "tile / (p.heads * p.batch)", "tile % p.heads", "tile / p.heads % p.batch"]
    assert str(plain["tile_x"]).startswith("tile % ceil_div(p.seqlen_q")
    tiles_x, heads, batch, ctas, trips = 22, 32, 4, 132, lambda x: -(-(4096 - 192 * x) // 128)
    count = tiles_x * heads * batch
    for order, expect in ((causal, 1.05), (plain, None)):
        seen, work = set(), [0] * ctas
        for t in range(count):
            env = {"tile": t, "p.heads": heads, "p.batch": batch, "p.seqlen_q": 4096}
            x, y, z = (evaluate(order[k], env) for k in ("tile_x", "tile_y", "tile_z"))
            seen.add((x, y, z))
            work[t % ctas] += trips(x)
        assert seen == {(x, y, z) for x in range(tiles_x) for y in range(heads) for z in range(batch)}
        ratio = max(work) / (sum(work) / ctas)
        assert ratio < expect if expect else ratio > 1.6, ratio


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
    touches = [i for i, op in enumerate(consumer.body) if "sQ" in K.nested_effects(op).shared_reads]
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
    store = max(i for i, op in enumerate(consumer.body) if "sO_out" in K.nested_effects(op).shared_reads)
    assert store < release
    # the epilogue wrote Q's bytes through the generic proxy; the next tile's TMA load writes them through
    # the async proxy: a proxy fence between the two, before the release the producer waits for
    assert isinstance(consumer.body[release - 1], H.FenceProxyAsyncOp)


def test_q_released_apart_from_the_staging_tile_needs_no_proxy_fence() -> None:
    consumer = _tile_loop(_roles(_lower().kir.kernels()[0]).consumer)
    assert not isinstance(consumer.body[_release_index(consumer) - 1], H.FenceProxyAsyncOp)


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


@settings(max_examples=60, deadline=None)
@given(causal=st.booleans(), sq=st.integers(1, 2000), heads=st.integers(1, 40), batch=st.integers(1, 5))
def test_tile_numbers_cover_the_grid_once(causal, sq, heads, batch) -> None:
    """tile_x/y/z, evaluated as the kernel does, map tile numbers 0 .. tiles−1 onto the one-tile-per-CTA
    grid one to one (the producer hands out each number once: blockIdx.x, then atomicAdd + gridDim.x)."""
    lets = _tile_lets(causal)
    p = {"p.seqlen_q": sq, "p.heads": heads, "p.batch": batch}
    gx = -(-sq // 128)
    seen = set()
    for tile in range(gx * heads * batch):
        env = dict(p, tile=tile)
        for op in lets:
            env[op.name] = evaluate(op.value, env)
        assert 0 <= env["tile_x"] < gx and 0 <= env["tile_y"] < heads and 0 <= env["tile_z"] < batch
        seen.add((env["tile_x"], env["tile_y"], env["tile_z"]))
    assert len(seen) == gx * heads * batch


_LOOPS: dict = {}


def _tile_lets(causal: bool) -> list[K.LetOp]:
    if causal not in _LOOPS:
        loop = _tile_loop(_roles(_lower(Causal=str(causal).lower()).kir.kernels()[0]).consumer)
        _LOOPS[causal] = [op for op in loop.body if isinstance(op, K.LetOp) and op.name.startswith("tile_")]
    return _LOOPS[causal]


def _before_persistent(spec: str = "mha_fwd", **defines: str) -> K.ProgramOp:
    """The kernel IR as `persistent` receives it (the lowering up to overlap-gemms)."""
    from tlc.lowering.state import start_state
    from tlc.passes.base import PassContext
    from tlc.passes.pipeline import LOWERING_PIPELINE, PassManager, parse_pipeline

    path = SPECS / f"{spec}.tl"
    graph, _ = compile_graph(path.read_bytes(), str(path), defines=defines)
    ctx = PassContext(arch="sm_90a")
    state = start_state(ctx, "sm_90a", name=spec)
    passes = LOWERING_PIPELINE[:LOWERING_PIPELINE.index("persistent")]
    PassManager(parse_pipeline(",".join(p if p != "lower-tile-ops" else "lower-tile-ops{arch=sm_90a}"
                                        for p in passes))).run(graph, ctx)
    return state.kir


def _consumer_ops(program: K.ProgramOp, fn) -> K.ProgramOp:
    import dataclasses
    kernel = program.kernels()[0]
    roles = kernel.body[-1]
    roles = dataclasses.replace(roles, consumer=tuple(fn(list(roles.consumer))))
    kernel = dataclasses.replace(kernel, body=(*kernel.body[:-1], roles))
    return dataclasses.replace(program, body=tuple(kernel if op is program.kernels()[0] else op for op in program.body))


def test_consumer_shared_writes_not_fenced_in_the_tile_get_a_barrier_at_its_top() -> None:
    """The staging tile is written after the epilogue's barrier, so tiles need none of their own;
    without that barrier, a write at the top of tile t+1 could overtake a read at the end of tile t,
    and the tile body opens with a barrier of all consumers."""
    from tlc.kir.transforms.attention.persistent import make_persistent

    def opens_with_barrier(program) -> bool:
        body = _tile_loop(_roles(program.kernels()[0]).consumer).body
        clear = next(i for i, op in enumerate(body) if isinstance(op, K.ClearOp))
        return any(isinstance(op, H.NamedBarrierOp) and op.id == 0 and op.threads == 256 and not op.arrive_only
                   for op in body[:clear])

    program = _before_persistent()
    kept, _ = make_persistent(program, 232448)
    assert not opens_with_barrier(kept)

    def drop_epilogue_barriers(ops):
        return [op for op in ops if not (isinstance(op, H.NamedBarrierOp) and op.id == 0)]

    fenced, _ = make_persistent(_consumer_ops(program, drop_epilogue_barriers), 232448)
    assert opens_with_barrier(fenced)


def test_a_wgmma_reading_what_the_consumers_write_is_declined() -> None:
    from tlc.kir.transforms.attention.persistent import make_persistent
    import dataclasses

    def gemm_reads_staging(ops):
        return [dataclasses.replace(x, body=tuple(
            dataclasses.replace(y, reads=(*y.reads, "sO_out")) if isinstance(y, H.WgmmaOp) else y for y in x.body))
            if isinstance(x, K.ForOp) else x for x in ops]

    program = _consumer_ops(_before_persistent(), gemm_reads_staging)
    out, notes = make_persistent(program, 232448)
    assert out is program
    assert notes == ["persistent: kept one tile per CTA: a wgmma reads sO_out, which the consumers write: its "
                     "order across tiles is not checked"]
