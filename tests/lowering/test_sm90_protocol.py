"""The sm_90a protocol checker (`tlc.kir.sm90_protocol`): every shipped spec's warp-specialised kernel, under the
tile shapes and schedule knobs sm_90a accepts, runs to its end with no problem at sizes {1, 17, BN ± 1, several
tiles}; and the kernel with one synchronising op broken (a dropped arrive, an init count one too high, a swapped
parity, a named barrier's thread count, the producer's empty-barrier wait removed, the 640-thread register split)
is refused. CPU only, no NVRTC.

The shape grid (spec × BM × BN × Stages × head dim × causal alignment × knobs) is too large for CI: a fixed-seed
sample of it (`GRID_SEED`, `GRID_DRAWS` draws, the ones sm_90a refuses skipped) runs next to a fixed list that
covers every spec and every knob. A wider sweep: `python3 tests/lowering/test_sm90_protocol.py 500 7`.
"""
from __future__ import annotations

import dataclasses
import random
import sys
from functools import lru_cache
from pathlib import Path

import pytest

from tlc.api import compile_graph
from tlc.diagnostics import TlcError
from tlc.kir import ops as K
from tlc.kir import ops_sm90 as H
from tlc.kir.base import rewrite_ops
from tlc.kir.expr import BinOp, Const, Var
from tlc.kir.sm90_protocol import ProtocolProblem, check_protocol, ctas_to_check, protocol_problems
from tlc.lowering.passes import run_lowering

SPECS = Path(__file__).resolve().parents[2] / "specs"
GRID_SEED, GRID_DRAWS = 30, 40


@lru_cache(maxsize=None)
def _lowered(spec: str, defines: tuple[tuple[str, str], ...]) -> K.ProgramOp:
    """The kernel IR of `spec` for sm_90a; a define the spec does not declare is appended as a Param."""
    path = SPECS / f"{spec}.tl"
    text = path.read_text()
    extra = {k: v for k, v in defines if f"\nParam {k} " not in text}
    text += "".join(f"\nParam {k} = {v}" for k, v in extra.items())
    graph, _ = compile_graph(text.encode(), str(path), defines={k: v for k, v in defines if k not in extra})
    return run_lowering(graph, "sm_90a", name=spec)[0].kir


def _lower(spec: str, **defines: str) -> K.ProgramOp:
    return _lowered(spec, tuple(sorted(defines.items())))


def _sizes(program: K.ProgramOp, gqa: bool) -> list[dict[str, int]]:
    """One row, an odd length inside a tile, one key tile ± 1, several tiles; query and key lengths apart."""
    boxes = [op.box[-2] for op in K.walk(program) if isinstance(op, H.TmaDescriptorOp)] or [128, 64]
    bm, bn = max(boxes), min(boxes)      # the query tile's rows and the key tile's (or the other way round)
    many = 2 * bm + bn + 3
    lengths = sorted({1, 17, bn - 1, bn + 1, many})
    pairs = [(n, n) for n in lengths] + [(17, many), (many, bn + 1)]
    return [{"seqlen_q": q, "seqlen_k": k, "batch": 1, "heads": 2, "group": 2 if gqa else 1} for q, k in pairs]


def _problems(spec: str, defines: dict[str, str]) -> list[ProtocolProblem]:
    program = _lower(spec, **defines)
    for sizes in _sizes(program, spec in ("gqa_fwd", "mqa_fwd")):
        problems = check_protocol(program, sizes)
        if problems:
            return problems
    return []


def _shown(problems: list[ProtocolProblem]) -> str:
    return "\n".join(f"{p}\n    " + "\n    ".join(n.message for n in p.notes) for p in problems[:4])


# ----------------------------------------------------------------------------- no problem in what sm_90a builds
SHIPPED = [
    ("mha_fwd", {}), ("mha_fwd", {"Causal": "true"}), ("mha_fwd", {"Causal": "true", "Align": "bottom_right"}),
    ("mha_fwd", {"HeadDim": "64", "BM": "64", "BN": "128"}), ("mha_fwd", {"HeadDim": "40", "Causal": "true"}),
    ("mha_fwd", {"BM": "256", "BN": "32", "Stages": "4", "HeadDim": "64"}),          # the 640-thread kernel
    ("gqa_fwd", {"Warps": "8", "Stages": "1"}), ("gqa_fwd", {"Warps": "8", "Stages": "3", "Causal": "true"}),
    ("gqa_fwd", {"HeadDim": "256", "Warps": "8", "BN": "80"}),
    ("gqa_fwd", {"Warps": "8", "BN": "176", "Causal": "true"}),
    ("mqa_fwd", {"Causal": "true"}), ("softcap_fwd", {"Causal": "true"}), ("b2b_gemm_relu", {}), ("chain3_fwd", {}),
    ("mla_prefill_fwd", {"Warps": "8"}), ("mha_fwd", {"Overlap": "false"}),
    ("mha_fwd", {"Causal": "true", "PingPong": "false"}),
    ("mha_fwd", {"TmaStore": "true"}), ("mha_fwd", {"WarpSpecialize": "false"}),
    ("mha_fwd", {"Persistent": "true"}), ("mha_fwd", {"Causal": "true", "Align": "bottom_right", "Persistent": "true"}),
    ("gqa_fwd", {"Warps": "8", "BN": "128", "Causal": "true", "Persistent": "true", "StaticTiles": "true"}),
    ("mha_fwd", {"HeadDim": "40", "Causal": "true", "TmaStore": "true", "Persistent": "true"}),
    ("gqa_fwd", {"HeadDim": "64", "BM": "192", "BN": "128", "Warps": "12", "Causal": "true", "Align": "bottom_right",
                 "Persistent": "true", "SkipMaskedTrips": "true"}),
    ("mha_fwd", {"Causal": "true", "SkipMaskedTrips": "true", "HeadDim": "256", "BN": "64"}),
    ("mha_fwd", {"Causal": "true", "Align": "bottom_right", "L2Sections": "true"}),
    ("gqa_fwd", {"Warps": "8", "BN": "128", "Causal": "true", "L2Sections": "true", "L2TailOnly": "true"}),
    ("gqa_fwd", {"HeadDim": "64", "BM": "192", "BN": "128", "Warps": "12", "Causal": "true", "SkipMaskedTrips": "true",
                 "PrefetchNext": "true"}),
    ("mha_fwd", {"Persistent": "true", "PrefetchNext": "true", "Trace": "true"}),
    ("mha_fwd", {"HeadDim": "256", "Persistent": "true"}),         # O staged over Q's bytes
]


@pytest.mark.parametrize("spec, defines", SHIPPED, ids=lambda v: v if isinstance(v, str) else
                         ",".join(f"{k}={x}" for k, x in v.items()) or "defaults")
def test_shipped_specs_have_no_protocol_problem(spec: str, defines: dict[str, str]) -> None:
    problems = _problems(spec, defines)
    assert not problems, _shown(problems)


def test_mla_decode_is_refused_by_sm_90a_before_there_is_a_protocol() -> None:
    with pytest.raises(TlcError, match="wgmma"):
        _lower("mla_decode_fwd", BM="64", Warps="4")


def _draw(rng: random.Random) -> tuple[str, dict[str, str]]:
    """One point of the shape grid sm_90a is asked to build."""
    spec = rng.choice(["mha_fwd", "gqa_fwd", "mqa_fwd", "softcap_fwd", "b2b_gemm_relu", "chain3_fwd",
                       "mla_prefill_fwd"])
    bm = rng.choice([64, 128, 192, 256])
    d = {"BM": str(bm), "BN": str(rng.choice(range(32, 177, 16))), "Stages": str(rng.randint(1, 4))}
    if spec in ("gqa_fwd", "mla_prefill_fwd", "chain3_fwd"):
        d["Warps"] = str(bm // 16)
    if spec in ("mha_fwd", "gqa_fwd", "mqa_fwd", "softcap_fwd"):
        d["HeadDim"] = str(rng.choice([64, 128, 256, 40, 96, 160]))
    causal = spec not in ("b2b_gemm_relu", "chain3_fwd") and rng.random() < 0.5
    if spec not in ("b2b_gemm_relu", "chain3_fwd"):
        d["Causal"], d["Align"] = str(causal).lower(), rng.choice(["top_left", "bottom_right"])
    if rng.random() < 0.35:
        d["Persistent"] = "true"
        for knob in ("StaticTiles", "PrefetchNext"):
            if rng.random() < 0.3:
                d[knob] = "true"
    elif causal and rng.random() < 0.3:
        d["L2Sections"] = "true"
    if causal and rng.random() < 0.4:
        d["SkipMaskedTrips"] = "true"
    if rng.random() < 0.25:
        d["TmaStore"] = "true"
    knob = rng.choice(["Overlap", "PingPong", None, None, None, None, None, None])
    if knob:
        d[knob] = "false"
    return spec, d


_RNG = random.Random(GRID_SEED)
GRID = [_draw(_RNG) for _ in range(GRID_DRAWS)]


@pytest.mark.parametrize("spec, defines", GRID, ids=[f"draw{i}" for i in range(len(GRID))])
def test_sampled_tile_shapes_have_no_protocol_problem(spec: str, defines: dict[str, str]) -> None:
    try:
        _lower(spec, **defines)
    except TlcError as why:
        pytest.skip(f"sm_90a refuses it: {str(why).splitlines()[0]}")
    problems = _problems(spec, defines)
    assert not problems, _shown(problems)


def test_ctas_cover_the_grid_edges_and_every_tile_of_a_persistent_kernel() -> None:
    causal = _lower("mha_fwd", Causal="true").kernels()[0]
    sizes = {"p.seqlen_q": 1000, "p.seqlen_k": 1000, "p.batch": 1, "p.heads": 2, "p.group": 1}
    assert [c.block[0] for c in ctas_to_check(causal, sizes)] == [0, 1, 4, 6, 7]
    # no trip count reads the block index of a non-causal kernel: one CTA stands for all
    assert len(ctas_to_check(_lower("mha_fwd").kernels()[0], sizes)) == 1
    persistent = _lower("mha_fwd", Persistent="true").kernels()[0]
    picked = ctas_to_check(persistent, sizes)
    assert {(c.ctas, c.block[0]) for c in picked} == {(1, 0), (2, 0), (2, 1), (16, 0), (16, 15)}
    assert next(c for c in picked if c.ctas == 2 and c.block[0] == 1).draws[:3] == (1, 3, 5)




# ----------------------------------------------------------------------------- broken protocols are refused
def _mutate(program: K.ProgramOp, match, change, nth: int = 0) -> K.ProgramOp:
    """`program` with the `nth` op (pre-order) for which `match(op)` holds rebuilt by `change` (None drops it)."""
    seen = []

    def visit(op: K.Op):
        if match(op):
            seen.append(op)
            if len(seen) - 1 == nth:
                return change(op)
        return op

    body = rewrite_ops(program.body, visit)
    assert len(seen) > nth, "the mutation matched no op"
    return dataclasses.replace(program, body=body)


def _role(program: K.ProgramOp, role: str):
    roles = next(op for op in K.walk(program) if isinstance(op, H.WarpSpecializeOp))
    inside = {id(x) for top in getattr(roles, role) for x in K.walk(top)}
    return lambda op: id(op) in inside


def _refused(program: K.ProgramOp, *, wants: str = "", gqa: bool = False) -> str:
    for sizes in _sizes(program, gqa):
        problems = check_protocol(program, sizes)
        if problems:
            text = _shown(problems)
            assert wants in text, text
            return text
    raise AssertionError("the checker found nothing wrong with a broken protocol")


@pytest.mark.parametrize("defines", [{"Persistent": "true"}, {"Causal": "true", "Persistent": "true",
                                                               "SkipMaskedTrips": "true"}], ids=["persistent", "skip"])
def test_every_dropped_arrive_is_refused(defines: dict[str, str]) -> None:
    """In a persistent kernel every release is needed by a later tile: dropping any one stalls a ring."""
    program = _lower("mha_fwd", **defines)
    arrives = sum(isinstance(op, H.MbarrierArriveOp) for op in K.walk(program))
    assert arrives >= 8
    for i in range(arrives):
        _refused(_mutate(program, lambda op: isinstance(op, H.MbarrierArriveOp), lambda op: None, i), wants="deadlock")


def test_a_dropped_release_in_the_main_loop_deadlocks() -> None:
    # (one CTA, one tile: a release in the last trips only is never waited for, and nothing is wrong)
    program = _mutate(_lower("mha_fwd"), lambda op: isinstance(op, H.MbarrierArriveOp), lambda op: None)
    assert "waits here: empty_sK[0] at phase 0 with 0 of 2" in _refused(program, wants="deadlock")


@pytest.mark.parametrize("bar, wants", [("empty_sK", "a phase left incomplete"), ("full_sK", "deadlock"),
                                        ("full_sQ", "deadlock")])
def test_an_init_count_one_too_high_is_refused(bar: str, wants: str) -> None:
    program = _mutate(_lower("mha_fwd"), lambda op: isinstance(op, H.MbarrierInitOp) and op.bar == bar,
                      lambda op: dataclasses.replace(op, arrivals=op.arrivals + 1))
    _refused(program, wants=wants)


def test_an_init_count_one_too_low_is_refused() -> None:
    program = _mutate(_lower("mha_fwd", Stages="3"),
                      lambda op: isinstance(op, H.MbarrierInitOp) and op.bar == "empty_sV",
                      lambda op: dataclasses.replace(op, arrivals=op.arrivals - 1))
    _refused(program)      # one group's release completes a phase: the rings' phases drift until they stall


@pytest.mark.parametrize("role, nth", [("consumer", 0), ("consumer", 3), ("producer", 0), ("producer", 1)])
def test_a_swapped_wait_parity_is_refused(role: str, nth: int) -> None:
    base = _lower("mha_fwd")
    inside = _role(base, role)
    program = _mutate(base, lambda op: isinstance(op, H.MbarrierWaitOp) and inside(op),
                      lambda op: dataclasses.replace(op, phase=BinOp("-", Const(1), op.phase)), nth)
    _refused(program)


@pytest.mark.parametrize("which, threads", [("epilogue", 128), ("epilogue", 384), ("ping-pong", 384),
                                            ("ping-pong", 128)])
def test_a_named_barrier_with_another_thread_count_is_refused(which: str, threads: int) -> None:
    if which == "epilogue":     # the consumers' barrier around the staging tile: user id 0, hardware barrier 8
        match = lambda op: isinstance(op, H.NamedBarrierOp) and op.id == 0  # noqa: E731
    else:                       # a warp group's turn: id 1 + warp_group, hardware barrier 9 or 10
        match = lambda op: isinstance(op, H.NamedBarrierOp) and not isinstance(op.id, int)  # noqa: E731
    program = _mutate(_lower("mha_fwd"), match, lambda op: dataclasses.replace(op, threads=threads))
    text = _refused(program, wants="hardware barrier")
    assert "is used with" in text or f"thread(s) arrived" in text


@pytest.mark.parametrize("defines", [{}, {"Persistent": "true"}, {"Stages": "1", "Warps": "8"}],
                         ids=["one-tile", "persistent", "one-stage"])
def test_a_producer_without_its_empty_barrier_wait_is_refused(defines: dict[str, str]) -> None:
    spec = "gqa_fwd" if "Warps" in defines else "mha_fwd"
    base = _lower(spec, **defines)
    producer = _role(base, "producer")
    program = _mutate(base, lambda op: isinstance(op, H.MbarrierWaitOp) and op.bar == "empty_sK" and producer(op),
                      lambda op: None)
    text = _refused(program, wants="TMA load into sK", gqa=spec == "gqa_fwd")
    assert "not ordered before it by any barrier" in text or "still in flight" in text


def test_a_consumer_reading_a_stage_it_did_not_wait_for_is_refused() -> None:
    base = _lower("mha_fwd")
    consumer = _role(base, "consumer")
    program = _mutate(base, lambda op: isinstance(op, H.MbarrierWaitOp) and op.bar == "full_sV" and consumer(op),
                      lambda op: None, 1)
    _refused(program, wants="wgmma read of sV stage 0 may overlap warp group 2 (producer), thread 256's TMA load")


def test_more_threads_than_a_named_barrier_counts_are_refused() -> None:
    program = _mutate(_lower("mha_fwd"), lambda op: isinstance(op, H.NamedBarrierOp) and op.id == 0,
                      lambda op: dataclasses.replace(op, threads=64))
    _refused(program, wants="128 threads arrive on hardware barrier 8, which counts 64")


def test_a_named_barrier_id_past_the_user_barriers_is_refused() -> None:
    program = _mutate(_lower("mha_fwd"), lambda op: isinstance(op, H.NamedBarrierOp) and not isinstance(op.id, int),
                      lambda op: dataclasses.replace(op, id=BinOp("+", Const(7), Var("warp_group"))))
    _refused(program, wants="uses named barrier 8; user barriers are 0..7")


@pytest.mark.parametrize("defines", [{"Causal": "true", "Persistent": "true"},
                                     {"HeadDim": "64", "BM": "192", "BN": "128", "Warps": "12", "Causal": "true",
                                      "SkipMaskedTrips": "true"}], ids=["persistent", "three-groups"])
def test_random_interleavings_find_nothing_either(defines: dict[str, str]) -> None:
    spec = "gqa_fwd" if "Warps" in defines else "mha_fwd"
    program = _lower(spec, **defines)
    for sizes in _sizes(program, spec == "gqa_fwd")[-3:]:
        problems = check_protocol(program, sizes, schedules=tuple(f"random-{seed}" for seed in range(4)))
        assert not problems, _shown(problems)


def test_the_old_640_thread_register_split_is_refused() -> None:
    base = _lower("mha_fwd", BM="256", BN="32", Stages="4", HeadDim="64")
    assert base.kernels()[0].threads == 640
    program = _mutate(base, lambda op: isinstance(op, H.WarpSpecializeOp),
                      lambda op: dataclasses.replace(op, consumer_regs=120))
    _refused(program, wants="24x128 + 120x512 = 64512 registers; 640 threads start with 96 each")


def test_mbarriers_used_before_their_init_is_visible_are_refused() -> None:
    program = _mutate(_lower("mha_fwd"), lambda op: type(op) is K.BarrierOp, lambda op: None)
    _refused(program, wants="before its initialisation is visible")


def test_syncthreads_after_the_role_split_is_refused() -> None:
    consumer = _role(_lower("mha_fwd"), "consumer")
    program = _mutate(_lower("mha_fwd"), lambda op: isinstance(op, H.NamedBarrierOp) and op.id == 0 and consumer(op),
                      lambda op: K.BarrierOp(loc=op.loc))
    _refused(program, wants="__syncthreads (hardware barrier 0, all 384 threads) in warp group")


def test_tma_bytes_that_do_not_match_the_announced_count_are_refused() -> None:
    more = _mutate(_lower("mha_fwd"), lambda op: isinstance(op, H.MbarrierArriveExpectTxOp) and op.bar == "full_sK",
                   lambda op: dataclasses.replace(op, bytes=op.bytes - 128))
    _refused(more, wants="more byte(s) on full_sK")
    fewer = _mutate(_lower("mha_fwd"), lambda op: isinstance(op, H.MbarrierArriveExpectTxOp) and op.bar == "full_sK",
                    lambda op: dataclasses.replace(op, bytes=op.bytes + 128))
    _refused(fewer, wants="128 byte(s) of TMA still expected")


def test_a_release_before_the_wgmma_retires_is_refused() -> None:
    """The consumer's release of K moved before the wait that retires the wgmma reading it."""
    base = _lower("mha_fwd")
    consumer = _role(base, "consumer")
    program = _mutate(base, lambda op: isinstance(op, H.WgmmaWaitOp) and consumer(op),
                      lambda op: dataclasses.replace(op, pending=1))
    _refused(program, wants="still in flight")


def test_o_staged_over_q_without_its_proxy_fence_is_refused() -> None:
    """d = 256 persistent: the epilogue writes its staging tile over Q's bytes through the generic proxy; the
    consumers' fence.proxy.async before they release Q keeps the next tile's TMA load of Q behind those writes."""
    base = _lower("mha_fwd", HeadDim="256", Persistent="true")
    assert protocol_problems(base) == []
    unfenced = _mutate(base, lambda op: isinstance(op, H.FenceProxyAsyncOp), lambda op: None)
    found = protocol_problems(unfenced)
    assert found and "mha_fwd.tl:33:" in found[0], found
    assert "TMA load into sQ goes through the async proxy after" in found[0] and "no fence.proxy.async" in found[0]


def test_what_the_checker_does_not_model_is_refused_not_passed() -> None:
    base = _lower("mha_fwd")
    consumer = _role(base, "consumer")
    # a ring wait under a warp vote (a branch on data)
    voted = _mutate(base, lambda op: isinstance(op, H.MbarrierWaitOp) and consumer(op),
                    lambda op: K.IfOp(cond=Var("rO_rescale"), body=(op,), loc=op.loc))
    assert "cannot prove" in _refused(voted)
    # a named barrier executed by one thread of a warp group
    lone = _mutate(base, lambda op: isinstance(op, H.NamedBarrierOp) and op.id == 0,
                   lambda op: K.IfOp(cond=BinOp("==", Var("threadIdx.x"), Const(0)),
                                     body=(op, H.MbarrierWaitOp(bar="full_sQ", stage=Const(0), phase=Const(0))),
                                     loc=op.loc))
    assert "cannot prove: named barrier 0 is executed by warp group 0 (consumer), thread" in _refused(lone)
    # a size the kernel reads that the check was not given
    problems = check_protocol(_lower("mha_fwd", Causal="true"), {"seqlen_q": 300, "batch": 1, "heads": 1, "group": 1})
    assert problems and problems[0].message.startswith("cannot prove:")


if __name__ == "__main__":       # a wider sweep of the grid: python3 tests/lowering/test_sm90_protocol.py DRAWS SEED
    draws, seed = (int(a) for a in sys.argv[1:3])
    rng = random.Random(seed)
    for spec_, defines_ in (_draw(rng) for _ in range(draws)):
        try:
            found_ = _problems(spec_, defines_)
        except TlcError:
            continue
        print(spec_, defines_, "ok" if not found_ else "\n" + _shown(found_), flush=True)
