"""A row vector stored to global memory (specs/mha_lse_fwd.tl: LSE = m + log(l), `Allocate LSE in global (seqlen_q)
as fp32`): the ABI's vector output, the kernel IR's RowStoreOp on both targets, the sm_90 kernel IR on the tile
evaluator equal to the interpreter at odd sizes (planted bugs caught), the emitted CuTe, the sm_90a protocol, the
refusals at their lines, and the launcher's fp32 (batch, heads, rows) output on the CPU. Not run on a GPU."""
from __future__ import annotations

import ctypes
import dataclasses
import math
from functools import lru_cache
from pathlib import Path

import pytest
import torch

from tlc.api import compile_graph
from tlc.diagnostics import TlcError
from tlc.ir.interpreter import run_program
from tlc.kir import ops as K
from tlc.kir.expr import Const
from tlc.kir.sm90_protocol import protocol_problems
from tlc.kir.tile_eval import evaluate_program
from tlc.lowering.emit_text import emit_text
from tlc.lowering.passes import run_lowering

SPEC = Path(__file__).resolve().parents[2] / "specs" / "mha_lse_fwd.tl"
SMALL = {"HeadDim": "32", "BM": "64", "BN": "32"}


@lru_cache(maxsize=None)
def lowered(arch: str, causal: str = "false", text: str | None = None):
    graph, _ = compile_graph(text or SPEC.read_text(), "lse.tl", defines=dict(SMALL, Causal=causal))
    state, _ = run_lowering(graph, arch, name="lse")
    return graph, state.kir, state.abi, state.schedule


def mismatch(causal: str, sq: int, sk: int, program: K.ProgramOp | None = None) -> str:
    graph, kir, abi, _ = lowered("sm_90", causal)
    g = torch.Generator().manual_seed(sq * 7 + sk)
    t = {n: torch.randn(2, 4 if n == "Q" else 2, sq if n == "Q" else sk, 32, generator=g).to(torch.bfloat16).double()
         for n in "QKV"}
    scalars = {"seqlen_q": sq, "seqlen_k": sk, "scale": 1 / math.sqrt(32)}
    given = dict(t, O=torch.full((2, 4, sq, 32), float("nan"), dtype=torch.float64),
                 LSE=torch.full((2, 4, sq), float("nan"), dtype=torch.float64))
    want = run_program(graph, given, scalars)
    got = evaluate_program(program or kir, abi, t, scalars)
    for name, tol in (("O", 1e-2), ("LSE", 1e-5)):
        if (torch.isnan(got[name]) != torch.isnan(want[name])).any():
            return f"{name}: {int(torch.isnan(got[name]).sum())} NaN, the interpreter {int(torch.isnan(want[name]).sum())}"
        err = (got[name] - want[name]).abs().max().item()
        if err > tol * max(1.0, want[name].abs().max().item()):
            return f"{name}: max error {err:.3e}"
    return ""


def test_the_abi_has_a_vector_output() -> None:
    _, _, abi, _ = lowered("sm_90")
    lse = next(t for t in abi.tensors if t.name == "LSE")
    assert (lse.dtype, lse.rows, lse.cols, lse.output) == ("fp32", "seqlen_q", 0, True)
    assert ("LSE_ptr", "ptr<f32>") in abi.fields()


@pytest.mark.parametrize("sq, sk", [(1, 1), (17, 33), (65, 63), (70, 9), (130, 97)])
@pytest.mark.parametrize("causal", ["false", "true"])
def test_kernel_ir_equals_interpreter_on_sm90(causal: str, sq: int, sk: int) -> None:
    assert mismatch(causal, sq, sk) == ""


def _replace_row_store(program: K.ProgramOp, **changes) -> K.ProgramOp:
    def walk(op: K.Op) -> K.Op:
        regions = {r: tuple(walk(c) for c in getattr(op, r)) for r in op.regions}
        op = dataclasses.replace(op, **regions) if regions else op
        return dataclasses.replace(op, **changes) if isinstance(op, K.RowStoreOp) else op
    return walk(program)  # type: ignore[return-value]


def test_a_planted_row_limit_is_caught() -> None:
    _, kir, _, _ = lowered("sm_90")
    assert "NaN" in mismatch("false", 70, 9, _replace_row_store(kir, row_limit=Const(3)))


def test_the_sum_not_the_lse_stored_is_caught() -> None:
    _, kir, _, _ = lowered("sm_90")
    store = next(x for x in K.walk(kir) if isinstance(x, K.RowStoreOp))
    other = next(x.name for x in K.walk(kir) if isinstance(x, K.RowVectorOp) and x.name != store.vec)
    assert mismatch("false", 17, 33, _replace_row_store(kir, vec=other)) != ""


def test_emitted_cute_writes_each_row_from_the_lane_of_column_0() -> None:
    source = emit_text(SPEC.read_bytes(), "lse.tl", "sm_90", SMALL, "cute", line_directives=False)
    lines = [line.strip() for line in source.splitlines()]
    assert "Tensor gLSE_rows = local_tile(mLSE, Shape<Int<64>>{}, make_coord(block_idx));" in lines
    assert "const int row_limit_ = p.seqlen_q - block_idx * 64;" in lines
    assert any(line.startswith("if (row < row_limit_) { gLSE_rows(row) = ") for line in lines)
    assert "float* LSE_ptr;" in lines


def test_sm90a_stores_it_from_the_consumers_and_keeps_the_exact_running_max() -> None:
    _, kir, _, notes = lowered("sm_90a", "true")
    assert any(isinstance(x, K.RowStoreOp) for x in K.walk(kir))
    assert protocol_problems(kir) == []
    assert any("lazy-rescale" in n and "running max" in n for n in notes), notes


@pytest.mark.parametrize("old, new, where, words", [
    ("Allocate LSE in global (seqlen_q) as fp32", "Allocate LSE in global (seqlen_q, 8)", "lse.tl:58:1",
     "'LSE' is a row vector; store it into a global vector"),
    ("Allocate LSE in global (seqlen_q) as fp32", "Allocate LSE in global (seqlen_q)", "lse.tl:33:1",
     "global vector 'LSE' (bf16) must be fp32, stored as a row vector"),
    ("Allocate LSE in global (seqlen_q) as fp32", "Allocate LSE in global (seqlen_q, 8) as fp32", "lse.tl:58:1",
     "'LSE' is a row vector; store it into a global vector"),
    ("Copy LSE (BM) in coordinate [L = block_idx] from", "Copy LSE (BM) in coordinate [L = block_idx from end] from",
     "lse.tl:58:1", "'LSE' is stored at [L = block_idx from end] of BM-row tiles"),
])
def test_what_a_row_store_cannot_be_is_refused_at_its_line(old: str, new: str, where: str, words: str) -> None:
    text = SPEC.read_text()
    assert old in text
    with pytest.raises(TlcError) as info:
        lowered("sm_90", "false", text.replace(old, new))
    messages = [f"{d.loc}: {d.message}" for d in info.value.diagnostics]
    assert any(m.startswith(where) and words in m for m in messages), messages


def test_the_launcher_allocates_an_fp32_row_vector_output(monkeypatch) -> None:
    from bench.launch_stand_ins import no_gpu, qkv, record, stand_in_kernel

    no_gpu(monkeypatch.setattr)
    _, kir, abi, _ = lowered("sm_90a")
    kernel = stand_in_kernel(kir, abi)
    driver = record(monkeypatch.setattr, ctypes.sizeof(kernel._struct))
    q, k, v = qkv(2, 4, 2, 40, 50, False, d=32)
    o, lse = kernel(q, k, v)
    assert (o.shape, o.dtype, lse.shape, lse.dtype) == ((2, 4, 40, 32), torch.bfloat16, (2, 4, 40), torch.float32)
    struct = kernel._struct.from_buffer_copy(driver.launches[-1][-1])
    assert struct.LSE_ptr == lse.data_ptr() and (struct.LSE_batch_stride, struct.LSE_row_stride) == (160, 1)


def test_the_lse_switch_points_to_the_program_storing_it() -> None:
    graph, _ = compile_graph(SPEC.read_text(), "lse.tl", defines=SMALL)
    with pytest.raises(TlcError, match="a program stores its log-sum-exp itself, as a row vector"):
        run_lowering(graph, "sm_90", name="lse", lse=True)


@pytest.mark.parametrize("coord", ["block_idx - 1", "0"])
def test_a_row_vector_stored_at_other_rows_than_its_own_is_refused(coord: str) -> None:
    """LSE's rows are Q's (loaded at [L = block_idx]): stored elsewhere, blocks would write before the vector
    or on each other's rows (found by review: the 2-D stores' check did not follow m and l)."""
    text = SPEC.read_text().replace("Copy LSE (BM) in coordinate [L = block_idx]", f"Copy LSE (BM) in coordinate [L = {coord}]")
    with pytest.raises(TlcError) as info:
        lowered("sm_90", "false", text)
    (d,) = [d for d in info.value.diagnostics if d.severity == "error"]
    assert d.loc.line == 58 and d.message.startswith(f"'LSE' is stored at [L = {coord}] of BM-row tiles") \
        and "its rows come from 'Q' loaded at [L = block_idx]" in d.message


def test_an_output_several_query_heads_would_write_is_refused() -> None:
    text = SPEC.read_text().replace("Allocate LSE in global (seqlen_q) as fp32 with offset head_idx",
                                    "Allocate LSE in global (seqlen_q) as fp32 with offset head_idx / group")
    with pytest.raises(TlcError, match=r"output 'LSE' is written at head `head_idx / group`, so the blocks of several"):
        lowered("sm_90", "false", text)


def test_out_must_be_the_first_outputs_tensor(monkeypatch) -> None:
    from bench.launch_stand_ins import no_gpu, qkv, record, stand_in_kernel

    no_gpu(monkeypatch.setattr)
    _, kir, abi, _ = lowered("sm_90a")
    kernel = stand_in_kernel(kir, abi)
    record(monkeypatch.setattr, ctypes.sizeof(kernel._struct))
    q, k, v = qkv(2, 4, 2, 40, 50, False, d=32)
    o = torch.empty(2, 4, 40, 32, dtype=torch.bfloat16)
    with pytest.raises(TlcError, match="out must be a torch.Tensor for the first output, O, got tuple"):
        kernel(q, k, v, out=(o, torch.empty(2, 4, 40)))
    assert kernel(q, k, v, out=o)[0] is o
