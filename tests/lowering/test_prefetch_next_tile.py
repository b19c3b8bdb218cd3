"""`prefetch-next-tile` (sm_90a, one tile per CTA, Param PrefetchNext): the producer prefetches into L2, before its
K/V ring, exactly the boxes the CTA `p.resident_ctas` places on (in the hardware's launch order) loads once,
in the grid the kernel runs (its own, or l2-sections' reordered one), and nothing past the grid's last CTA.
GPU: tests/gpu/test_sm90a_specs_gpu.py's `*_prefetch_next` cases."""
from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.tail_model import lower_state
from tlc.api import compile_graph
from tlc.backend_cute.launch import launcher_filled_fields
from tlc.backend_cute.emit import emit_program
from tlc.diagnostics import TlcError
from tlc.kir import ops as K
from tlc.kir import ops_sm90 as H
from tlc.kir.evaluate import evaluate
from tlc.kir.expr import free_names
from tlc.kir.text import parse_kir, print_kir
from tlc.lowering.passes import run_lowering

SPECS = Path(__file__).resolve().parents[2] / "specs"
D64_CAUSAL = dict(HeadDim="64", BM="192", BN="128", Warps="12", Causal="true", PrefetchNext="true")
KERNELS = {
    "d64_causal": ("gqa_fwd", D64_CAUSAL),
    "d128": ("gqa_fwd", dict(HeadDim="128", BM="128", BN="128", Warps="8", PrefetchNext="true")),
    "d256_causal_l2": ("gqa_fwd", dict(HeadDim="256", BM="128", BN="64", Warps="8", Causal="true",
                                       L2Sections="true", PrefetchNext="true")),
    "mla_causal": ("mla_prefill_fwd", dict(DQK="192", DV="128", BM="128", BN="128", Warps="8", Causal="true",
                                           Align="top_left", PrefetchNext="true")),
}
_LOWERED = {name: lower_state(spec, **defines) for name, (spec, defines) in KERNELS.items()}


def _producer_block(kernel) -> tuple[K.IfOp, tuple[K.Op, ...]]:
    """The producer block that holds the prefetch guard, and that block's ops."""
    (roles,) = [op for op in kernel.body if isinstance(op, H.WarpSpecializeOp)]
    for op in roles.producer:
        for block in K.walk(op):
            if isinstance(block, K.IfOp):
                guards = [x for x in block.body if isinstance(x, K.IfOp)
                          and any(isinstance(y, H.TmaPrefetchTileOp) for y in x.body)]
                if guards:
                    return guards[0], block.body
    raise AssertionError("no prefetch in the producer")


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_the_prefetch_sits_before_the_ring_and_adds_the_resident_ctas_field(name) -> None:
    state = _LOWERED[name]
    kernel = state.kir.kernels()[0]
    guard, block = _producer_block(kernel)
    at = block.index(guard)
    ring_at = next(i for i, op in enumerate(block) if isinstance(op, K.ForOp))
    once = [op for op in block[:ring_at] if isinstance(op, H.TmaLoadOp)]
    prefetches = [op for op in guard.body if isinstance(op, H.TmaPrefetchTileOp)]
    assert at < ring_at and [op.desc for op in prefetches] == [op.desc for op in once]
    assert {op.desc for op in once} == {"tma_Q"}   # Q in 64-column boxes: one at d = 64, two at d = 128
    (params,) = [op for op in state.kir.body if isinstance(op, H.TmaParamsOp)]
    assert params.fields[-1] == (H.RESIDENT_CTAS_FIELD, "i32")
    assert any(n.startswith("prefetch-next-tile: the producer prefetches sQ") for n in state.schedule)
    assert print_kir(parse_kir(print_kir(state.kir))) == print_kir(state.kir)
    cute = emit_program(state.kir)
    assert cute.count("SM90_TMA_LOAD_4D::PREFETCH::copy(tma_Q, ") == len(once) and "int resident_ctas;" in cute


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_each_let_the_coordinates_read_through_the_block_index_is_redeclared_once(name) -> None:
    """The prefetch reads the kernel's own lets (their i32 arithmetic, not an inlined expression per coordinate):
    the ones that depend on the block index once each as `<name>_next`, the others as they are."""
    kernel = _LOWERED[name].kir.kernels()[0]
    guard, _ = _producer_block(kernel)
    lets = {op.name: op for op in kernel.body if isinstance(op, K.LetOp)}
    copies = [op for op in guard.body if isinstance(op, K.LetOp)]
    assert len({op.name for op in copies}) == len(copies) and all(op.name.endswith("_next") for op in copies)
    grid_block = {"blockIdx.x", "blockIdx.y", "blockIdx.z"}
    for op in copies:
        original = lets[op.name.removesuffix("_next")]
        assert free_names(original.value) & (grid_block | {n for n in lets if f"{n}_next" in {c.name for c in copies}})
        assert not free_names(op.value) & grid_block and op.type == original.type
    for prefetch in (op for op in guard.body if isinstance(op, H.TmaPrefetchTileOp)):
        for c in prefetch.coord:
            assert not free_names(c) & (grid_block | {"block_idx", "head_idx", "batch_idx"}) and len(str(c)) < 200


def _env_at(kernel, params: dict, linear: int, grid: tuple[int, int, int]) -> dict:
    """The kernel's top-level lets at the CTA the hardware numbers `linear` (x fastest)."""
    gx, gy, gz = grid
    env = dict(params, **{"gridDim.x": gx, "gridDim.y": gy, "gridDim.z": gz, "blockIdx.x": linear % gx,
                          "blockIdx.y": linear // gx % gy, "blockIdx.z": linear // (gx * gy)})
    for op in kernel.body:
        if isinstance(op, K.LetOp) and free_names(op.value) <= env.keys():
            env[op.name] = evaluate(op.value, env)
    return env


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(sorted(KERNELS)), sq=st.integers(1, 3000), sk_extra=st.integers(0, 500),
       heads=st.integers(1, 9), batch=st.integers(1, 3), resident=st.integers(1, 300), data=st.data())
def test_each_cta_prefetches_what_the_cta_resident_places_on_loads(name, sq, sk_extra, heads, batch, resident,
                                                                    data) -> None:
    kernel = _LOWERED[name].kir.kernels()[0]
    params = {"p.seqlen_q": sq, "p.seqlen_k": sq + sk_extra, "p.heads": heads, "p.batch": batch, "p.group": 1,
              f"p.{H.RESIDENT_CTAS_FIELD}": resident}
    grid = tuple(evaluate(g, params) for g in kernel.grid)
    total = grid[0] * grid[1] * grid[2]
    guard, block = _producer_block(kernel)
    loads = [op for op in block[:block.index(guard)] if isinstance(op, H.TmaLoadOp)]
    prefetches = [op for op in guard.body if isinstance(op, H.TmaPrefetchTileOp)]
    for b in {0, total - 1, data.draw(st.integers(0, total - 1))}:
        env = _env_at(kernel, params, b, grid)
        for op in block[:block.index(guard)]:
            if isinstance(op, K.LetOp):
                env[op.name] = evaluate(op.value, env)
        if b + resident >= total:
            assert not evaluate(guard.cond, env)
            continue
        assert evaluate(guard.cond, env)
        for op in guard.body:   # the lets re-declared for the next CTA, then the prefetches
            if isinstance(op, K.LetOp):
                env[op.name] = evaluate(op.value, env)
        there = _env_at(kernel, params, b + resident, grid)
        for prefetch, load in zip(prefetches, loads, strict=True):
            assert [evaluate(c, env) for c in prefetch.coord] == [evaluate(c, there) for c in load.coord], (b, grid)


@pytest.mark.parametrize("defines,why", [
    (dict(D64_CAUSAL, Persistent="true"), "persistent: the producer loads its next tile itself"),
    (dict(KERNELS["d128"][1], WarpSpecialize="false"), "not one sm_90a kernel with TMA parameters"),
    (dict(D64_CAUSAL, PrefetchNext="false"), None)])
def test_other_kernels_keep_their_producer(defines, why) -> None:
    state = lower_state("gqa_fwd", **defines)
    assert not any(isinstance(op, H.TmaPrefetchTileOp) for op in K.walk(state.kir))
    assert H.RESIDENT_CTAS_FIELD not in {n for op in state.kir.body if isinstance(op, H.TmaParamsOp) for n, _ in op.fields}
    notes = "\n".join(state.schedule)
    assert (f"prefetch-next-tile: kept: {why}" in notes) if why else "prefetch-next-tile" not in notes


def test_the_sm80_family_kernel_is_left_alone() -> None:
    path = SPECS / "gqa_fwd.tl"
    graph, _ = compile_graph(path.read_bytes(), str(path), defines=dict(HeadDim="64", BM="128", BN="128",
                                                                       Warps="4", PrefetchNext="true"))
    state = run_lowering(graph, "sm_90", name="gqa_fwd")[0]
    assert "prefetch-next-tile: kept: not one sm_90a kernel with TMA parameters" in state.schedule


def test_a_value_that_is_not_a_bool_is_refused_at_its_param_line(tmp_path) -> None:
    path = tmp_path / "p.tl"
    path.write_text((SPECS / "gqa_fwd.tl").read_text() + "\nParam PrefetchNext = 2\n")
    graph, _ = compile_graph(path.read_bytes(), str(path), defines={k: v for k, v in D64_CAUSAL.items()
                                                                    if k != "PrefetchNext"})
    with pytest.raises(TlcError) as err:
        run_lowering(graph, "sm_90a", name="gqa_fwd")
    line = len((SPECS / "gqa_fwd.tl").read_text().splitlines()) + 2
    assert f"p.tl:{line}:1: error: Param PrefetchNext = 2: use true or false" in err.value.render()


def test_the_launcher_fills_the_fields_its_ops_read_and_leaves_a_users_input_of_that_name(tmp_path) -> None:
    assert launcher_filled_fields(_LOWERED["d64_causal"].kir.kernels()[0]) == {H.RESIDENT_CTAS_FIELD}
    for defines, want in ((dict(D64_CAUSAL, Persistent="true"), {H.TILE_COUNTER}),
                          (dict(D64_CAUSAL, Persistent="true", StaticTiles="true"), set())):
        assert launcher_filled_fields(lower_state("gqa_fwd", **defines).kir.kernels()[0]) == want
    path = tmp_path / "mine.tl"   # a program whose own runtime Input is named like the launcher's field
    text = (SPECS / "gqa_fwd.tl").read_text().replace("Input scale : float", "Input scale : float\nInput resident_ctas : int")
    path.write_text(text)
    graph, _ = compile_graph(path.read_bytes(), str(path), defines=D64_CAUSAL)
    state = run_lowering(graph, "sm_90a", name="gqa_fwd")[0]
    assert "prefetch-next-tile: kept: the parameter struct already has a field resident_ctas" in state.schedule
    assert launcher_filled_fields(state.kir.kernels()[0]) == set()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seq_k", [1024, 4096])
def test_tlc_attention_kernels_prefetch_exactly_when_they_run_one_tile_per_cta(causal, seq_k) -> None:
    """What tlc.attention builds at d = 128 on sm_90a: one tile per CTA with the prefetch (S = 4k), or a
    persistent kernel without it (short keys) — lowered from the shipped spec with attention_spec's bindings."""
    from tlc.attention.kernels import attention_spec

    spec, defines = attention_spec("bf16", 128, 128, causal, "sm_90a", seq_k)
    kernel = lower_state(spec.stem, **{k: str(v).lower() if isinstance(v, bool) else str(v)
                                       for k, v in defines.items()}).kir.kernels()[0]
    prefetches = [op for op in K.walk(kernel) if isinstance(op, H.TmaPrefetchTileOp)]
    persistent = bool(defines.get("Persistent"))
    assert persistent == (seq_k == 1024)
    assert bool(prefetches) == (not persistent)
    assert launcher_filled_fields(kernel) == (
        set() if persistent and not causal else {H.TILE_COUNTER} if persistent else {H.RESIDENT_CTAS_FIELD})
