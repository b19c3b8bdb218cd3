"""Reduce-stores and fp32 outputs (specs/group_sum_fwd.tl: each query head's attention output added into its KV
head's rows of an fp32 O, `… to global and add`): the ABI's zeroed fp32 output with kv_heads heads, the kernel IR's
FragStoreOp on both targets, the sm_90 kernel IR on the tile evaluator equal to the interpreter at odd sizes and
GQA/MQA groups (planted bugs caught: a plain store races, a wrong limit writes), a plain fp32 store the same way,
the emitted atomicAdd, the sm_90a protocol, the refusals at their lines, and the launcher's zeroed output."""
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
from tlc.kir.tile_eval import TileEvalError, evaluate_program
from tlc.lowering.emit_text import emit_text
from tlc.lowering.passes import run_lowering

SPEC = Path(__file__).resolve().parents[2] / "specs" / "group_sum_fwd.tl"
SMALL = {"HeadDim": "32", "BM": "64", "BN": "32"}
STORE = "Copy O (BM, HeadDim) in coordinate [L = block_idx] from register to global and add"
# the same program storing each query head's O plainly into an fp32 tensor of its own head
PLAIN = SPEC.read_text().replace(STORE, STORE.removesuffix(" and add")).replace(
    "as fp32 with offset head_idx / group", "as fp32 with offset head_idx")


@lru_cache(maxsize=None)
def lowered(arch: str, causal: str = "false", text: str | None = None):
    graph, _ = compile_graph(text or SPEC.read_text(), "sum.tl", defines=dict(SMALL, Causal=causal))
    state, _ = run_lowering(graph, arch, name="sum")
    return graph, state.kir, state.abi, state.schedule


def mismatch(causal: str, sq: int, sk: int, heads: int = 4, kv: int = 2, program: K.ProgramOp | None = None,
             text: str | None = None) -> str:
    graph, kir, abi, _ = lowered("sm_90", causal, text)
    g = torch.Generator().manual_seed(sq * 7 + sk)
    t = {n: torch.randn(2, heads if n == "Q" else kv, sq if n == "Q" else sk, 32, generator=g).to(torch.bfloat16).double()
         for n in "QKV"}
    scalars = {"seqlen_q": sq, "seqlen_k": sk, "scale": 1 / math.sqrt(32)}
    out_heads = abi.tensors[-1].head_count(heads, heads // kv)
    start = torch.zeros if abi.tensors[-1].added else (lambda *s, **k: torch.full(s, float("nan"), **k))
    want = run_program(graph, dict(t, O=start(2, out_heads, sq, 32, dtype=torch.float64)), scalars)["O"]
    got = evaluate_program(program or kir, abi, t, scalars)["O"]
    if got.shape != want.shape:
        return f"shape {tuple(got.shape)}, the interpreter's {tuple(want.shape)}"
    if (torch.isnan(got) != torch.isnan(want)).any():
        return f"{int(torch.isnan(got).sum())} NaN, the interpreter {int(torch.isnan(want).sum())}"
    err = (got - want).abs().max().item()
    return f"max error {err:.3e}" if err > 1e-2 * max(1.0, want.abs().max().item()) else ""


def _replace_store(program: K.ProgramOp, **changes) -> K.ProgramOp:
    def walk(op: K.Op) -> K.Op:
        regions = {r: tuple(walk(c) for c in getattr(op, r)) for r in op.regions}
        op = dataclasses.replace(op, **regions) if regions else op
        return dataclasses.replace(op, **changes) if isinstance(op, K.FragStoreOp) else op
    return walk(program)  # type: ignore[return-value]


def test_the_abi_has_a_zeroed_fp32_output_with_a_head_per_kv_head() -> None:
    _, _, abi, _ = lowered("sm_90")
    o = next(t for t in abi.tensors if t.name == "O")
    assert (o.dtype, o.head, o.output, o.added) == ("fp32", "floor_div(head_idx, group)", True, True)
    assert (o.head_count(8, 4), o.head_count(8, 1), o.head_count(8, 8)) == (2, 8, 1)
    assert abi.to_json()["tensors"][-1]["added"] is True and "added" not in abi.to_json()["tensors"][0]


@pytest.mark.parametrize("sq, sk", [(1, 1), (17, 33), (65, 63), (130, 97)])
@pytest.mark.parametrize("causal", ["false", "true"])
def test_kernel_ir_equals_interpreter_on_sm90(causal: str, sq: int, sk: int) -> None:
    assert mismatch(causal, sq, sk) == ""


@pytest.mark.parametrize("heads, kv", [(3, 1), (4, 4)])
def test_mqa_and_one_query_head_per_kv_head(heads: int, kv: int) -> None:
    assert mismatch("true", 70, 45, heads, kv) == ""


def test_a_plain_fp32_store_equals_the_interpreter() -> None:
    _, kir, abi, _ = lowered("sm_90", "false", PLAIN)
    assert [op.add for op in K.walk(kir) if isinstance(op, K.FragStoreOp)] == [False]
    assert not abi.tensors[-1].added
    assert mismatch("false", 70, 45, text=PLAIN) == ""


def test_a_plain_store_of_the_sums_is_a_race_the_evaluator_catches() -> None:
    _, kir, _, _ = lowered("sm_90")
    with pytest.raises(TileEvalError, match="a race between CTAs"):
        mismatch("false", 17, 33, program=_replace_store(kir, add=False))


def test_a_planted_row_limit_is_caught() -> None:
    _, kir, _, _ = lowered("sm_90")
    assert mismatch("false", 70, 9, program=_replace_store(kir, row_limit=Const(3))) != ""


@pytest.mark.parametrize("arch, ident, cols, test", [
    ("sm_90", "tSc64x32", 32, "row < row_limit_"),
    ("sm_90a", "tCc64x64", 64, "row < row_limit_ && col < col_limit_")])   # sm_90a pads 32 columns to 64
def test_emitted_cute_adds_each_in_range_element_atomically(arch: str, ident: str, cols: int, test: str) -> None:
    source = emit_text(SPEC.read_bytes(), "sum.tl", arch, SMALL, "cute", line_directives=False)
    lines = [line.strip() for line in source.splitlines()]
    assert f"Tensor gO_add = local_tile(mO, Shape<Int<64>, Int<{cols}>>{{}}, make_coord(block_idx, 0));" in lines
    assert f"const int row = get<0>({ident}(i)), col = get<1>({ident}(i));" in lines
    assert f"if ({test}) {{ atomicAdd(&gO_add(row, col), rO(i)); }}" in lines
    assert "float* O_ptr;" in lines


def test_sm90a_adds_from_the_consumers() -> None:
    _, kir, _, _ = lowered("sm_90a", "true")
    assert [op.add for op in K.walk(kir) if isinstance(op, K.FragStoreOp)] == [True]
    assert protocol_problems(kir) == []


@pytest.mark.parametrize("old, new, line, words", [
    ("as fp32 with offset head_idx / group", "with offset head_idx / group", 51,
     "'and add' adds a register tile into an fp32 global tensor of (rows, cols); 'O' is bf16"),
    (STORE, STORE.removesuffix(" and add") + "\n" + STORE, 52,
     "'O' is stored with 'and add' here but line 51 stores it; store a tensor one way"),
    (STORE, STORE.removesuffix(" and add"), 29, "output 'O' is written at head `head_idx / group`"),
    ("Copy Q (BM, HeadDim) in coordinate [L = block_idx] from global to shared",
     "Copy Q (BM, HeadDim) in coordinate [L = block_idx] from global to shared and add", 36,
     "'and add' adds a tile into a global tensor; this copy writes shared memory"),
])
def test_what_a_reduce_store_cannot_be_is_refused_at_its_line(old: str, new: str, line: int, words: str) -> None:
    text = SPEC.read_text()
    assert old in text
    with pytest.raises(TlcError) as info:
        lowered("sm_90", "false", text.replace(old, new))
    messages = [f"{d.loc.line}: {d.message}" for d in info.value.diagnostics]
    assert any(m.startswith(f"{line}: ") and words in m for m in messages), messages


def test_the_launcher_zeroes_the_output_it_adds_into(monkeypatch) -> None:
    from bench.launch_stand_ins import no_gpu, qkv, record, stand_in_kernel

    no_gpu(monkeypatch.setattr)
    _, kir, abi, _ = lowered("sm_90a")
    kernel = stand_in_kernel(kir, abi)
    driver = record(monkeypatch.setattr, ctypes.sizeof(kernel._struct))
    q, k, v = qkv(2, 4, 2, 40, 50, False, d=32)
    o = kernel(q, k, v)
    assert (o.shape, o.dtype) == ((2, 2, 40, 32), torch.float32) and bool((o == 0).all())
    given = torch.full((2, 2, 40, 32), float("nan"))
    assert kernel(q, k, v, out=given) is given and bool((given == 0).all())
    struct = kernel._struct.from_buffer_copy(driver.launches[-1][-1])
    assert struct.O_ptr == given.data_ptr() and struct.O_head_stride == 40 * 32


@pytest.mark.parametrize("offset, words", [
    ("head_idx % 3", r"a reduce-store's target takes `with offset head_idx` \(a head per query head\)"),
    ("head_idx - 1", "a reduce-store's target takes `with offset head_idx`"),
])
def test_a_reduce_store_at_a_head_the_launch_cannot_size_is_refused(offset: str, words: str) -> None:
    """Found by review: any offset was taken, and the output sized by the last query head's (heads 1, 2 of
    `head_idx % 3` added past the end of a 1-head tensor; `2 - head_idx` launched nothing)."""
    text = SPEC.read_text().replace("as fp32 with offset head_idx / group", f"as fp32 with offset {offset}")
    with pytest.raises(TlcError, match=words):
        lowered("sm_90", "false", text)


def test_a_reduce_store_per_kv_head_needs_an_input_that_fixes_the_group() -> None:
    """Found by review: without a `group` input the launch took group 1 and stored every query head unsummed."""
    text = """Param HeadDim = 32
Param BM = 64
Param BN = 32
Param Causal = false
Input seqlen_q : int
Allocate X in global (seqlen_q, HeadDim) as fp32 with offset head_idx
Allocate Y in global (seqlen_q, HeadDim) as fp32 with offset head_idx / group
Copy X (BM, HeadDim) in coordinate [L = block_idx] from global to register
Compute Exp X and get Y
Copy Y (BM, HeadDim) in coordinate [L = block_idx] from register to global and add
"""
    with pytest.raises(TlcError, match="no input tensor is read at a `group` offset"):
        lowered("sm_90", "false", text)
