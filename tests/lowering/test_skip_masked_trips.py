"""`skip-masked-trips` (sm_90a, causal, two or more consumer warp groups, `Param SkipMaskedTrips = true`):
each warp group skips the GEMMs and softmax of the trips its own rows mask. The consumer's control flow
is walked for concrete sizes (every ring wait and release, named barrier and wgmma a group executes, in
order) with the pass on and off: the protocol the producer and the other groups see must be the same,
the group must compute a prefix of the trips, and the trips it skips must be masked for all its rows.
NVRTC: tests/nvrtc/test_sm90a_nvrtc.py; GPU (odd sizes, bottom-right, persistent): tests/gpu/test_sm90a_specs_gpu.py.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tlc.api import compile_graph
from tlc.kir import ops as K
from tlc.kir import ops_sm90 as H
from tlc.kir.evaluate import evaluate
from tlc.kir.expr import free_names
from tlc.lowering.passes import run_lowering
from tlc.attention.kernels import attention_spec
from tlc.kir.transforms.attention.skip_masked_trips import window_of

SPECS = Path(__file__).resolve().parents[2] / "specs"
D64 = {"HeadDim": "64", "BM": "192", "BN": "128", "Warps": "12", "Causal": "true"}
D256 = {"HeadDim": "256", "BN": "64", "Warps": "8", "Causal": "true"}
_PROTOCOL = (H.MbarrierWaitOp, H.MbarrierArriveOp, H.NamedBarrierOp, H.WgmmaWaitOp, H.WgmmaCommitOp)


def _lower(spec: str = "gqa_fwd", **defines: str):
    return _lowered(spec, tuple(sorted(defines.items())))


# gqa_fwd with its K/V tiles one tile later ([L = n + 1]), or the loop from 1 reading tile n − 1: trip n's
# keys start at (n ± 1)·BN, which the guards must follow (they read each trip's causal mask origin, not the
# trip number; counting by trip number would skip a trip the rows need in the second)
KV_SHIFTED, KV_BACK = "gqa_fwd_kv_shifted", "gqa_fwd_kv_back"
_VARIANTS = {KV_SHIFTED: ((b"[L = n] from global", b"[L = n + 1] from global"),),
             KV_BACK: ((b"[L = n] from global", b"[L = n - 1] from global"),
                       (b"for n = 0:seqlen_k / BN", b"for n = 1:seqlen_k / BN + 1"))}


@lru_cache(maxsize=None)
def _lowered(spec: str, defines: tuple):
    path = SPECS / f"{'gqa_fwd' if spec in _VARIANTS else spec}.tl"
    text = path.read_bytes()
    for old, new in _VARIANTS.get(spec, ()):
        assert old in text
        text = text.replace(old, new)
    graph, _ = compile_graph(text, str(path), defines=dict(defines))
    return run_lowering(graph, "sm_90a", name="gqa_fwd")[0]


def _consumer(state) -> tuple[K.Op, ...]:
    return next(op for op in K.walk(state.kir.kernels()[0]) if isinstance(op, H.WarpSpecializeOp)).consumer


def _run(ops, env: dict, events: list) -> None:
    """Walk one warp group's control flow: lets, counters and loops evaluated, each synchronising op and
    wgmma recorded with its evaluated stage / phase (a wgmma with the trip `n` it runs in)."""
    for op in ops:
        if isinstance(op, K.LetOp):
            env[op.name] = evaluate(op.value, env)
        elif isinstance(op, K.CounterOp):
            env[op.name] = evaluate(op.init, env)
        elif isinstance(op, K.CounterSetOp):
            env[op.counter] = evaluate(op.value, env)
        elif isinstance(op, K.IfOp):
            if not free_names(op.cond) <= env.keys():   # a data-dependent branch (a warp vote): no protocol in it
                assert not any(isinstance(x, (*_PROTOCOL, H.WgmmaOp)) for x in K.walk(op)), op.cond
            elif evaluate(op.cond, env):
                _run(op.body, env, events)
        elif isinstance(op, K.ForOp) and not op.unroll:
            n = evaluate(op.start, env)
            while n < evaluate(op.stop, env):
                env[op.var] = n
                _run(op.body, env, events)
                n += op.step
        elif isinstance(op, (H.MbarrierWaitOp, H.MbarrierArriveOp)):
            phase = evaluate(op.phase, env) if isinstance(op, H.MbarrierWaitOp) else None
            events.append((op.bar, evaluate(op.stage, env), phase))
        elif isinstance(op, H.NamedBarrierOp):
            events.append(("named", op.id if isinstance(op.id, int) else evaluate(op.id, env), op.arrive_only))
        elif isinstance(op, (H.WgmmaWaitOp, H.WgmmaCommitOp)):
            events.append(("wgmma-sync", type(op).__name__, getattr(op, "pending", None)))
        elif isinstance(op, H.WgmmaOp):
            events.append(("wgmma", op.acc))
        elif isinstance(op, K.MaskOp) and window_of(op) is not None:
            events.append(("mask", evaluate(op.col0, env)))   # the first key of the trip it masks


def _events(consumer, sq: int, sk: int, block: int, group: int) -> list:
    env = {"p.seqlen_q": sq, "p.seqlen_k": sk, "block_idx": block, "warp_group": group,
           "threadIdx.x": 128 * group, "p.scale": 1.0}
    events: list = []
    _run(consumer, env, events)
    return events


@pytest.mark.parametrize("spec,defines", [
    ("gqa_fwd", D64), ("gqa_fwd", {**D64, "Align": "bottom_right", "Stages": "3"}),
    ("gqa_fwd", {**D64, "SplitMasked": "false"}), ("gqa_fwd", D256), (KV_SHIFTED, D64), (KV_BACK, D64)])
@settings(max_examples=40, deadline=None)
@given(sq=st.integers(1, 1200), sk=st.integers(1, 1200), block=st.integers(0, 7), group=st.integers(0, 2))
def test_a_group_computes_the_trips_its_rows_see_and_keeps_the_protocol(spec: str, defines: dict, sq: int, sk: int,
                                                                      block: int, group: int) -> None:
    group %= int(defines["Warps"]) // 4
    bm, bn = int(defines.get("BM", 128)), int(defines["BN"])
    block %= -(-sq // bm)      # a tile of the grid (ceil_div(sq, BM) of them)
    on = _events(_consumer(_lower(spec, **defines, SkipMaskedTrips="true")), sq, sk, block, group)
    off = _events(_consumer(_lower(spec, **defines)), sq, sk, block, group)
    # the producer and the other groups see the same ring traffic and ping-pong turns; the group's wgmma
    # commit groups and waits are the same too (a skipped GEMM leaves an empty group)
    compute = ("wgmma", "mask")
    assert [e for e in on if e[0] not in compute] == [e for e in off if e[0] not in compute]
    # compute: the masked trips' softmax for a prefix of them; one Q·Kᵀ and one P·V fewer per skipped trip
    masked_off = [e[1] for e in off if e[0] == "mask"]
    masked_on = [e[1] for e in on if e[0] == "mask"]
    assert masked_on == masked_off[:len(masked_on)]
    skipped = masked_off[len(masked_on):]
    for acc in ("acc_S", "rO"):
        assert on.count(("wgmma", acc)) == off.count(("wgmma", acc)) - len(skipped)
    # every trip the group skips is masked for all its rows (gqa_fwd: query tiles counted from the end)
    row0 = sq - (block + 1) * bm + 64 * group
    diag = sk - sq if defines.get("Align") == "bottom_right" else 0
    for first in skipped:
        assert all(c > r + diag for r in range(max(row0, 0), row0 + 64) for c in range(first, first + bn)), first


WINDOW = {"Warps": "8"}   # specs/sliding_window_fwd.tl: 128-row tiles (two consumer groups), 64-key tiles, Window 256


@settings(max_examples=60, deadline=None)
@given(sq=st.integers(1, 1500), sk=st.integers(1, 1500), block=st.integers(0, 11), group=st.integers(0, 1),
       window=st.sampled_from([64, 100, 256]))
def test_a_sliding_window_group_skips_the_trips_its_rows_see_none_of(sq: int, sk: int, block: int, group: int,
                                                                     window: int) -> None:
    """The window's both edges (tlc.expr.key_window): a group skips the trips left of its first row's first key
    and right of its last row's last key, keeps the protocol, and every trip it skips is masked for all its rows."""
    defines = dict(WINDOW, Window=str(window))
    block %= -(-sq // 128)
    on = _events(_consumer(_lower("sliding_window_fwd", **defines, SkipMaskedTrips="true")), sq, sk, block, group)
    off = _events(_consumer(_lower("sliding_window_fwd", **defines)), sq, sk, block, group)
    compute = ("wgmma", "mask")
    assert [e for e in on if e[0] not in compute] == [e for e in off if e[0] not in compute]
    masked_off = [e[1] for e in off if e[0] == "mask"]
    masked_on = [e[1] for e in on if e[0] == "mask"]
    skipped = [c for c in masked_off if c not in masked_on]
    assert masked_on == [c for c in masked_off if c not in skipped]   # the trips kept, in order
    for acc in ("acc_S", "rO"):
        assert on.count(("wgmma", acc)) == off.count(("wgmma", acc)) - len(skipped)
    row0 = block * 128 + 64 * group
    for first in skipped:   # `kv_idx > q_idx || kv_idx < q_idx - Window` for every row and key of the trip
        assert all(c > r or c < r - window for r in range(row0, row0 + 64) for c in range(first, first + 64)), first


def test_a_sliding_window_takes_both_of_its_edges() -> None:
    state = _lower("sliding_window_fwd", **WINDOW, SkipMaskedTrips="true")
    lets = {op.name: str(op.value) for top in _consumer(state) for op in K.walk(top) if isinstance(op, K.LetOp)
            and op.name in ("wg_last_key", "wg_first_key")}
    assert lets == {"wg_last_key": "block_idx * 128 + (64 * (warp_group + 1) - 1)",
                    "wg_first_key": "block_idx * 128 + 64 * warp_group - 256"}
    assert any("skip-masked-trips: each of 2 consumer warp groups" in n for n in state.schedule), state.schedule


def test_192_row_tiles_guard_both_gemms_and_the_softmax_of_masked_trips() -> None:
    state = _lower(**D64, SkipMaskedTrips="true")
    consumer = _consumer(state)
    (last,) = [op for top in consumer for op in K.walk(top) if isinstance(op, K.LetOp) and op.name == "wg_last_key"]
    assert str(last.value) == "p.seqlen_q - (block_idx + 1) * 192 + (64 * (warp_group + 1) - 1) + 0"
    guarded = [(str(op.cond), x.acc) for top in consumer for op in K.walk(top) if isinstance(op, K.IfOp)
               and ("wg_last_key" in str(op.cond) or "p_live" in str(op.cond)) for x in op.body if isinstance(x, H.WgmmaOp)]
    # the peeled first trip and the masked loop: Q·Kᵀ while the trip's first key (its mask's col0) is one
    # the group sees; each P·V under p_live (the masked loop's, reading the trip before, and the last after
    # the loop); the unmasked loop untouched
    assert guarded == [("0 * 128 <= wg_last_key", "acc_S"), ("n * 128 <= wg_last_key", "acc_S"), ("p_live", "rO"),
                       ("p_live", "rO")]
    sets = [str(op.value) for top in consumer for op in K.walk(top) if isinstance(op, K.CounterSetOp)]
    assert sets == ["0 * 128 <= wg_last_key", "n * 128 <= wg_last_key"]
    shifted = _consumer(_lower(KV_SHIFTED, **D64, SkipMaskedTrips="true"))
    assert [str(op.cond) for top in shifted for op in K.walk(top) if isinstance(op, K.IfOp)
            and "wg_last_key" in str(op.cond) and any(isinstance(x, H.WgmmaOp) for x in op.body)] == [
        "(0 + 1) * 128 <= wg_last_key", "(n + 1) * 128 <= wg_last_key"]
    assert any("skip-masked-trips: each of 3 consumer warp groups" in n for n in state.schedule)


def test_persistent_tiles_are_guarded_inside_the_tile_loop() -> None:
    consumer = _consumer(_lower(**D64, Persistent="true", SkipMaskedTrips="true"))
    (tiles,) = [op for op in consumer if isinstance(op, K.ForOp)]
    assert any(isinstance(op, K.LetOp) and op.name == "wg_last_key" for op in tiles.body)


@pytest.mark.parametrize("defines, why", [
    ({"HeadDim": "64", "BM": "64", "BN": "128", "Causal": "true"}, "one consumer warp group"),
    ({**D64, "Overlap": "false"}, "the first trip is not peeled (overlap-gemms off)"),
])
def test_declines_with_the_reason(defines: dict, why: str) -> None:
    state = _lower(**defines, SkipMaskedTrips="true")
    assert f"skip-masked-trips: kept: {why}" in state.schedule
    assert not any(isinstance(op, K.CounterSetOp) for top in _consumer(state) for op in K.walk(top))


def test_off_by_default_and_on_for_tlc_attention_at_d64_causal() -> None:
    assert not any("skip-masked-trips" in n for n in _lower(**D64).schedule)
    assert not any("skip-masked-trips" in n for n in _lower(**{**D64, "Causal": "false"}, SkipMaskedTrips="true").schedule)
    assert attention_spec("bf16", 64, 64, True, "sm_90a")[1]["SkipMaskedTrips"] is True
    for d, causal, arch in ((64, False, "sm_90a"), (128, True, "sm_90a"), (64, True, "sm_90")):
        assert "SkipMaskedTrips" not in attention_spec("bf16", d, d, causal, arch)[1]
    # asked for on an sm_80-family kernel: nothing to skip per warp group, and the notes say so
    path = SPECS / "mha_fwd.tl"
    graph, _ = compile_graph(path.read_bytes(), str(path), defines={"Causal": "true", "SkipMaskedTrips": "true"})
    state = run_lowering(graph, "sm_90", name="mha_fwd")[0]
    assert "skip-masked-trips: kept: not warp-specialised (sm_90a only)" in state.schedule
    assert not any(isinstance(op, K.CounterSetOp) for op in K.walk(state.kir))


@settings(max_examples=60, deadline=None)
@given(sq=st.integers(1, 3000), sk=st.integers(1, 3000), block=st.integers(0, 20), group=st.integers(0, 2),
       bottom_right=st.booleans())
def test_wg_last_key_is_the_last_key_a_row_of_the_group_sees(sq: int, sk: int, block: int, group: int,
                                                              bottom_right: bool) -> None:
    align = "bottom_right" if bottom_right else "top_left"
    state = _lower(**D64, Align=align, SkipMaskedTrips="true")
    (last,) = [op for top in _consumer(state) for op in K.walk(top) if isinstance(op, K.LetOp) and op.name == "wg_last_key"]
    got = evaluate(last.value, {"p.seqlen_q": sq, "p.seqlen_k": sk, "block_idx": block, "warp_group": group})
    row0 = sq - (block + 1) * 192 + 64 * group
    diag = sk - sq if bottom_right else 0
    assert got == max(r + diag for r in range(row0, row0 + 64))   # the mask keeps c <= r + diag


def test_the_share_of_masked_warp_group_trips_the_docs_quote() -> None:
    """docs/hopper.md: 3 % of all warp-group trips at S = 4096 on 192 × 128 tiles (query tiles from the end)
    are masked for the group's rows: wg_last_key per group, brute force over every tile."""
    s, bm, bn, total, masked = 4096, 192, 128, 0, 0
    for tile in range(-(-s // bm)):
        end = s - bm * tile
        trips = -(-end // bn)
        for group in range(3):
            last = end - bm + 64 * (group + 1) - 1
            total += trips
            masked += sum(n * bn > last for n in range(trips))
    assert round(masked / total, 3) == 0.030


def test_a_trip_that_changes_more_than_the_softmax_is_not_skipped() -> None:
    """`Compute Multiply O, 0.5` in the loop halves O in masked trips too: skipping them would change O."""
    from tlc.api import compile_graph
    from tlc.lowering.passes import run_lowering

    spec = Path(__file__).resolve().parents[2] / "specs" / "mha_fwd.tl"
    text = spec.read_text().replace("\n  Compute GEMM P, V and accumulate O\n",
                                    "\n  Compute GEMM P, V and accumulate O\n  Compute Multiply O, 0.5 and get new O\n")
    defines = {"Causal": "true", "HeadDim": "64", "BM": "192", "SkipMaskedTrips": "true"}
    graph, _ = compile_graph(text.encode(), "halved.tl", defines=defines)
    state, _ = run_lowering(graph, "sm_90a", name="halved")
    assert any(n.startswith("skip-masked-trips: kept: a trip whose scores are all masked still changes 'O'")
               for n in state.schedule), state.schedule


def test_a_window_trip_that_changes_more_than_the_softmax_is_not_skipped() -> None:
    """The same precondition holds for a predicate mask: a sliding window's halved O keeps every trip."""
    spec = SPECS / "sliding_window_fwd.tl"
    text = spec.read_text().replace("\n  Compute GEMM P, V and accumulate O\n",
                                    "\n  Compute GEMM P, V and accumulate O\n  Compute Multiply O, 0.5 and get new O\n")
    graph, _ = compile_graph(text.encode(), "halved.tl", defines={**WINDOW, "SkipMaskedTrips": "true"})
    state, _ = run_lowering(graph, "sm_90a", name="halved")
    assert any(n.startswith("skip-masked-trips: kept: a trip whose scores are all masked still changes 'O'")
               for n in state.schedule), state.schedule
    assert not any(isinstance(op, K.CounterSetOp) for op in K.walk(state.kir))


@pytest.mark.parametrize("window", ["40", "256"])
def test_the_skipping_window_kernel_passes_the_protocol_checker(window: str) -> None:
    from tlc.kir.sm90_protocol import protocol_problems

    state = _lower("sliding_window_fwd", **WINDOW, Window=window, SkipMaskedTrips="true")
    assert any(isinstance(op, K.CounterSetOp) for op in K.walk(state.kir))
    assert protocol_problems(state.kir) == []


def test_generated_windowed_programs_skipping_trips_keep_the_sm90a_protocol() -> None:
    """tlc.testing.structural's windowed programs (a predicate window beside any causal mask, every structural
    departure) with `Param SkipMaskedTrips = true`, lowered for sm_90a: each builds or is refused at a line, and
    every kernel that builds passes the protocol checker."""
    from tlc.builder import lower_to_kernel_ir
    from tlc.diagnostics import TlcError
    from tlc.kir.sm90_protocol import protocol_problems
    from tlc.testing.structural import choices_of_seed

    built = 0
    for seed in range(60):
        c = choices_of_seed(seed, windowed=True)
        text = c.render().replace("Param dtype", "Param SkipMaskedTrips = true\nParam dtype", 1)
        try:
            state, _ = lower_to_kernel_ir(text.encode(), "generated.tl", "sm_90a", c.defines_dict() or {},
                                          name="generated")
        except TlcError as exc:
            assert all(d.loc and d.loc.line > 0 for d in exc.diagnostics), f"seed {seed}: {exc.render()}"
            continue
        built += 1
        assert protocol_problems(state.kir) == [], f"seed {seed}: {c.describe()}"
    assert built >= 20
