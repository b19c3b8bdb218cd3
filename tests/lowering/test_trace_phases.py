"""`trace-phases` (Param Trace) and `prefetch-tma-descriptors` (Param PrefetchTma): where the stamps
and prefetches go, what the emitter writes for them, that the defaults emit neither, and the
timeline reader's arithmetic (bench/timeline.py) on stamps laid out as the kernel writes them.
Tile-evaluated equality with the interpreter: the `mha_causal_trace` case of test_tile_eval.py."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench.timeline import analyse
from tlc.api import compile_graph
from tlc.backend_cute.emit import emit_program
from tlc.kir import ops as K
from tlc.kir import ops_sm90 as H
from tlc.kir.transforms.trace_phases import BUFFER
from tlc.lowering.passes import run_lowering

SPECS = Path(__file__).resolve().parents[2] / "specs"


def _lower(arch: str, spec: str = "mha_fwd", **defines: str):
    path = SPECS / f"{spec}.tl"
    graph, _ = compile_graph(path.read_bytes(), str(path), defines=defines)
    return run_lowering(graph, arch, name=spec)[0]


def _stamps(kir) -> list[K.TimestampOp]:
    return [op for op in K.walk(kir) if isinstance(op, K.TimestampOp)]


def test_a_warp_specialised_kernel_is_stamped_at_each_role_boundary() -> None:
    state = _lower("sm_90a", Causal="true", Trace="true")
    stamps = _stamps(state.kir)
    labels = [s.label for s in stamps]
    assert labels[0] == "cta:start" and [s.slot for s in stamps] == list(range(len(stamps)))
    assert {s.slots for s in stamps} == {len(stamps)}
    producer = [x for x in labels if x.startswith("producer:")]
    consumer = [x for x in labels if x.startswith("consumer:")]
    assert producer == ["producer:start", "producer:loop0:begin", "producer:loop0:end", "producer:end"]
    assert consumer == ["consumer:start", "consumer:wait0", "consumer:loop0:begin", "consumer:loop0:end",
                        "consumer:loop1:begin", "consumer:loop1:end", "consumer:epilogue", "consumer:end"]
    (roles,) = [op for op in K.walk(state.kir) if isinstance(op, H.WarpSpecializeOp)]
    (issue,) = roles.producer   # the producer's stamps sit in its one-thread branch
    assert isinstance(issue.body[0], K.TimestampOp) and isinstance(issue.body[-1], K.TimestampOp)
    first = roles.consumer.index(next(op for op in roles.consumer if isinstance(op, H.MbarrierWaitOp)))
    assert roles.consumer[first + 1].label == "consumer:wait0"
    (buffer,) = [op for op in state.kir.body if isinstance(op, K.TraceBufferOp)]
    assert buffer.name == BUFFER and state.kir.body.index(buffer) < state.kir.body.index(state.kir.kernels()[0])
    assert any(n.startswith("trace-phases: mha_fwd: 13 stamps") for n in state.schedule)
    cute = emit_program(state.kir)
    assert f"__device__ unsigned long long {BUFFER}[" in cute and f"void {BUFFER}_stamp(int slots, int slot, unsigned long long unit)" in cute
    assert f"if (threadIdx.x % 128 == 0) {BUFFER}_stamp(13, 0, {BUFFER}_cta());  // cta:start" in cute


def test_an_sm80_kernel_is_stamped_around_its_loops_and_the_default_has_no_stamps() -> None:
    labels = [s.label for s in _stamps(_lower("sm_90", Trace="true").kir)]
    assert labels[0] == "cta:start" and labels[-1] == "cta:end" and "cta:loop0:begin" in labels
    for arch in ("sm_90", "sm_90a"):
        kir = _lower(arch).kir
        assert not _stamps(kir) and not any(isinstance(op, (K.TraceBufferOp, H.TmaPrefetchOp)) for op in K.walk(kir))
        assert "_stamp(" not in emit_program(kir) and "prefetch_tma_descriptor" not in emit_program(kir)


def test_a_persistent_kernel_is_stamped_per_turn_of_its_tile_loop() -> None:
    state = _lower("sm_90a", Trace="true", Persistent="true")
    stamps = _stamps(state.kir)
    assert stamps[0].label == "cta:start" and stamps[0].index is None
    turns = [s for s in stamps[1:]]
    assert turns and all(str(s.index) == "tile_iter * gridDim.x + blockIdx.x" for s in turns)
    loops = [op for op in K.walk(state.kir) if isinstance(op, K.ForOp) and op.var == "tile_iter"]
    assert len(loops) == 2 and all(isinstance(op.body[0], K.TimestampOp) or isinstance(op.body[0], K.IfOp)
                                   for op in loops)
    assert "producer:wait0" in [s.label for s in turns]    # the producer's wait for the consumers' Q release


def test_each_descriptor_is_prefetched_where_the_mbarriers_are_set_up() -> None:
    state = _lower("sm_90a", PrefetchTma="true")
    kernel = state.kir.kernels()[0]
    (init,) = [op for op in kernel.body if isinstance(op, K.IfOp)
               and any(isinstance(b, H.MbarrierInitOp) for b in op.body)]
    descs = [op.name for op in kernel.body if isinstance(op, H.TmaDescriptorOp)]
    assert [op.desc for op in init.body[:len(descs)]] == descs and len(descs) == 3
    assert all(isinstance(op, H.TmaPrefetchOp) for op in init.body[:len(descs)])
    assert "cute::prefetch_tma_descriptor(tma_Q);" in emit_program(state.kir)
    assert "prefetch-tma-descriptors: tma_Q, tma_K, tma_V" in state.schedule


def _clock(sm: int, t: int) -> int:
    return (sm << 56) | t


def test_the_timeline_reader_measures_phases_and_gaps_per_sm() -> None:
    # 3 CTAs × 2 warp groups × 3 slots (0 start, 1 loop, 2 end) at 1000 MHz: 1 cycle = 1 ns
    labels = {0: "cta:start", 1: "consumer:loop0:begin", 2: "consumer:end"}
    raw = np.zeros(64, dtype=np.uint64)
    layout = {0: (7, 0, 1000, 4000), 1: (7, 5000, 5500, 9000), 2: (9, 100, 1100, 4100)}
    for cta, (sm, t0, t1, t2) in layout.items():
        for group in range(2):
            base = (cta * 2 + group) * 3
            raw[base:base + 3] = [_clock(sm, t0), _clock(sm, t1 + group), _clock(sm, t2 + 10 * group)]
    out = analyse(raw, 3, labels, 3, 2, mhz=1000.0)
    loop = out["phases"]["cta:start -> consumer:loop0:begin"]
    assert loop["n"] == 6 and loop["median"] == pytest.approx(1.0, abs=1e-3)
    assert out["sm_gap_us"]["n"] == 1 and out["sm_gap_us"]["median"] == pytest.approx(0.99)   # 4010 → 5000 on SM 7
    assert out["cta_span_us"]["median"] == pytest.approx(4.01)
    assert out["sms"] == 2 and out["ctas_traced"] == 3
