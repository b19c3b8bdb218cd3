"""specs/varlen_fwd.tl: packed sequences read and written through row maps (`rows at cu_seqlens_q[batch_idx] +
row`), the output scattered to the queries' rows. The interpreter equals an independent per-sequence attention
(lengths 0 included, causal at each sequence's end); the sm_90 kernel IR on the tile evaluator equals the
interpreter, and leaves every storage row no sequence owns unwritten (NaN); two sequences mapped onto one
storage row is a race the evaluator reports; sm_90a keeps cp.async and its protocol holds; the emitted CuTe
scatters the staged store row by row. Not run on a GPU here (tests/gpu/test_varlen_gpu.py)."""
from __future__ import annotations

import dataclasses
import math
from functools import lru_cache
from pathlib import Path

import pytest
import torch

from tlc.api import compile_graph
from tlc.ir.interpreter import run_program
from tlc.kir import ops as K
from tlc.kir.sm90_protocol import protocol_problems
from tlc.kir.tile_eval import evaluate_program
from tlc.kir.tile_eval_state import TileEvalError
from tlc.lowering.emit_text import emit_text
from tlc.lowering.passes import run_lowering

SPEC = Path(__file__).resolve().parents[2] / "specs" / "varlen_fwd.tl"
D = 32


def small(causal: bool) -> dict[str, str]:
    return {"HeadDim": str(D), "BM": "64", "BN": "32", "Causal": str(causal).lower()}


@lru_cache(maxsize=None)
def lowered(arch: str, causal: bool):
    graph, _ = compile_graph(SPEC.read_text(), "varlen.tl", defines=small(causal))
    state, _ = run_lowering(graph, arch, name="varlen")
    return graph, state.kir, state.abi


def packed(lq: list[int], lk: list[int], h: int = 4, kvh: int = 2, seed: int = 0):
    """Q, K, V storages with 3 spare NaN rows each, the offsets, and the Inputs."""
    g = torch.Generator().manual_seed(seed)
    cq = torch.tensor([0, *torch.tensor(lq).cumsum(0).tolist()], dtype=torch.int32)
    ck = torch.tensor([0, *torch.tensor(lk).cumsum(0).tolist()], dtype=torch.int32)
    tq, tk = int(cq[-1]), int(ck[-1])
    t = {"Q": torch.randn(1, h, tq + 3, D, generator=g), "K": torch.randn(1, kvh, tk + 3, D, generator=g),
         "V": torch.randn(1, kvh, tk + 3, D, generator=g)}
    for x in t.values():
        x.copy_(x.to(torch.bfloat16).double())
        x[:, :, -3:] = float("nan")
    t = {k: v.double() for k, v in t.items()}
    runtime = {"seqlen_q": max(lq), "seqlen_k": max(lk), "scale": 1 / math.sqrt(D), "cu_seqlens_q": cq,
               "cu_seqlens_k": ck}
    return t, runtime


def reference(t: dict, runtime: dict, causal: bool) -> torch.Tensor:
    cq, ck = runtime["cu_seqlens_q"].tolist(), runtime["cu_seqlens_k"].tolist()
    out = torch.full((1, t["Q"].shape[1], t["Q"].shape[2], D), float("nan"), dtype=torch.float64)
    group = t["Q"].shape[1] // t["K"].shape[1]
    for b in range(len(cq) - 1):
        q = t["Q"][0, :, cq[b]:cq[b + 1]]
        k, v = (t[n][0, :, ck[b]:ck[b + 1]].repeat_interleave(group, 0) for n in "KV")
        s = q @ k.transpose(-1, -2) * runtime["scale"]
        if causal:
            i, j = torch.arange(q.shape[1])[:, None], torch.arange(k.shape[1])[None]
            s = s.masked_fill(j > i + k.shape[1] - q.shape[1], float("-inf"))
        out[0, :, cq[b]:cq[b + 1]] = torch.softmax(s, -1).nan_to_num(0.0) @ v if k.shape[1] else 0.0
    return out


def interpreted(graph, t: dict, runtime: dict) -> torch.Tensor:
    o = torch.full((1, t["Q"].shape[1], t["Q"].shape[2], D), float("nan"), dtype=torch.float64)
    return run_program(graph, dict(t, O=o), runtime)["O"]


CASES = [([0, 17, 70, 5], [3, 40, 70, 1]), ([1], [1]), ([65, 63], [130, 9]), ([2, 0, 33], [0, 5, 64])]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lq, lk", CASES)
def test_the_interpreter_equals_attention_over_each_sequence(lq, lk, causal: bool) -> None:
    graph, _, _ = lowered("sm_90", causal)
    t, runtime = packed(lq, lk, seed=len(lq))
    got, want = interpreted(graph, t, runtime), reference(t, runtime, causal)
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    assert (got - want).nan_to_num(0.0).abs().max().item() < 1e-12


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lq, lk", CASES)
def test_kernel_ir_equals_interpreter_on_sm90(lq, lk, causal: bool) -> None:
    graph, kir, abi = lowered("sm_90", causal)
    t, runtime = packed(lq, lk, seed=7 * len(lq))
    want = interpreted(graph, t, runtime)
    o = torch.full_like(want, float("nan"))
    got = evaluate_program(kir, abi, dict(t, O=o), runtime)["O"]
    assert torch.equal(torch.isnan(got), torch.isnan(want))   # the spare rows, and no row written twice
    err = (got - want).nan_to_num(0.0).abs().max().item()
    assert err <= 2e-2 * max(1.0, want.nan_to_num(0.0).abs().max().item())


def scatter_race(o_map: str, lq: int) -> str:
    """The tile evaluator's fault storing O through `o_map` for one sequence of `lq` queries, or ""."""
    o_line = next(line for line in SPEC.read_text().splitlines() if line.startswith("Allocate O in global"))
    text = SPEC.read_text().replace(o_line, o_line.replace("rows at cu_seqlens_q[batch_idx] + row", f"rows at {o_map}"))
    graph, _ = compile_graph(text, "v.tl", defines=small(False))
    state, _ = run_lowering(graph, "sm_90", name="v")
    t, runtime = packed([lq], [20])
    try:
        evaluate_program(state.kir, state.abi, dict(t, O=torch.full((1, 4, lq + 3, D), float("nan"),
                                                                     dtype=torch.float64)), runtime)
    except TileEvalError as exc:
        return exc.diagnostics[0].message
    return ""


@pytest.mark.parametrize("o_map, lq, words", [
    ("row % 64", 100, "which CTA #0 stored too"),   # the second query tile's CTA writes the first one's rows
    ("cu_seqlens_q[batch_idx] + row / 2", 40, "stores two rows of one tile to row 0"),   # rows 2i, 2i + 1 of a CTA
])
def test_two_rows_scattered_to_one_storage_row_is_a_race_the_evaluator_reports(o_map: str, lq: int, words: str) -> None:
    found = scatter_race(o_map, lq)
    assert words in found and "two rows map to one storage row" in found, found


def test_sm90a_keeps_cp_async_and_its_protocol_holds() -> None:
    _, kir, _ = lowered("sm_90a", True)
    copies = [op for op in K.walk(kir) if isinstance(op, (K.AsyncCopyOp, K.CopyOp)) and op.gather]
    assert {op.gather for op in copies} == {"mQ", "mK", "mV", "mO"}
    assert protocol_problems(kir) == []


def test_the_emitted_cute_scatters_the_output_rows() -> None:
    source = emit_text(SPEC.read_bytes(), "varlen.tl", "sm_90", small(False), "cute", line_directives=False)
    lines = [line.strip() for line in source.splitlines()]
    # every row's storage row first (the loads in flight together), then the copies
    at = lines.index("at_rows_[gm_] = int(((batch_idx >= 0 && batch_idx < p.batch + 1) ? p.cu_seqlens_q_ptr[batch_idx] "
                     ": 0) + row_);")
    assert lines.index("const int at_ = at_rows_[gm_];", at) < lines.index("auto drow_ = make_tensor(dst_(_, gm_, "
                                                                          "_).data() + int64_t(at_ - row_) * "
                                                                          "stride<0>(mO), dst_(_, gm_, _).layout());", at)
    assert "auto drow_ = make_tensor(dst_(_, gm_, _).data() + int64_t(at_ - row_) * stride<0>(mO), " \
           "dst_(_, gm_, _).layout());" in lines
    assert "int O_storage_rows;" in lines


def test_an_fp32_output_through_a_row_map_is_refused_at_its_store() -> None:
    from tlc.diagnostics import TlcError

    text = SPEC.read_text().replace("Allocate O in global (min(cu_seqlens_q[batch_idx + 1] - cu_seqlens_q[batch_idx], "
                                    "seqlen_q), HeadDim) with offset head_idx",
                                    "Allocate O in global (min(cu_seqlens_q[batch_idx + 1] - cu_seqlens_q[batch_idx], "
                                    "seqlen_q), HeadDim) as fp32 with offset head_idx", 1)
    graph, _ = compile_graph(text, "v.tl", defines=small(False))
    with pytest.raises(TlcError, match="stored through a row map, which the lowering scatters from the staged"):
        run_lowering(graph, "sm_90", name="v")


def test_the_interpreter_refuses_a_storage_per_sequence() -> None:
    from tlc.ir.interpreter import InterpError

    graph, _, _ = lowered("sm_90", False)
    t, runtime = packed([17, 5], [9, 9])
    t = {k: v.expand(2, *v.shape[1:]) for k, v in t.items()}
    with pytest.raises(InterpError, match=r"its storage, which the batch shares, is \(1, heads, rows, cols\)"):
        interpreted(graph, t, runtime)
