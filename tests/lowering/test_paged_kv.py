"""specs/paged_kv_fwd.tl: K and V read through a row map (`and rows at block_table[batch_idx, row / PageSize] *
PageSize + row % PageSize`, tlc/ir/row_maps.py) from a pool the batch shares. The interpreter equals an independent
paged attention; the sm_90 kernel IR on the tile evaluator equals the interpreter at odd sizes, GQA and page sizes
16 (four pages per key tile), 64 (one) and 128 (half a page per tile), with every pool row no sequence reads NaN;
planted bugs in the gather are caught; sm_90a keeps cp.async for the gathered tiles (a TMA box cannot gather)
and its protocol holds; the emitted CuTe shifts each row to its storage row; the launcher binds the pool and
refuses a per-batch one; the kernel-IR text, cache codec and ABI round-trip; what a row map cannot be is refused
at its line (stores through one: tests/lowering/test_varlen.py). Not run on a GPU here (tests/gpu: paged64*, paged128*)."""
from __future__ import annotations

import ctypes
import dataclasses
import json
import math
from functools import lru_cache
from pathlib import Path

import pytest
import torch

from tests.frontend.paged_reference import paged_attention
from tlc.api import compile_graph
from tlc.backend_cute.kir_codec import decode, encode
from tlc.diagnostics import TlcError
from tlc.frontend.format import format_program
from tlc.frontend.lower import lower_program
from tlc.frontend.parser import parse_text
from tlc.ir.interpreter import run_program
from tlc.kir import ops as K
from tlc.kir.expr import E
from tlc.kir.sm90_protocol import protocol_problems
from tlc.kir.text import parse_kir, print_kir
from tlc.kir.tile_eval import evaluate_program
from tlc.kir.tile_eval_state import TileEvalError
from tlc.lowering.abi import LaunchABI
from tlc.lowering.emit_text import emit_text
from tlc.lowering.passes import run_lowering

SPEC = Path(__file__).resolve().parents[2] / "specs" / "paged_kv_fwd.tl"
D = 32


def small(page: int, bn: int = 32) -> dict[str, str]:
    return {"HeadDim": str(D), "BM": "64", "BN": str(bn), "PageSize": str(page)}


@lru_cache(maxsize=None)
def lowered(arch: str, page: int = 16, bn: int = 32):
    graph, _ = compile_graph(SPEC.read_text(), "paged.tl", defines=small(page, bn))
    state, _ = run_lowering(graph, arch, name="paged")
    return graph, state.kir, state.abi, state.schedule


def paged_inputs(b: int, h: int, kvh: int, sq: int, sk: int, page: int, seed: int, lengths=None):
    """Dense K/V, their pool (pages scattered by a permutation, 3 spare pages; every row no sequence sees NaN),
    the table and the lengths (0, the whole cache, past it, half of it)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, sq, D, generator=g).to(torch.bfloat16).double()
    kd = torch.randn(b, kvh, sk, D, generator=g).to(torch.bfloat16).double()
    vd = torch.randn(b, kvh, sk, D, generator=g).to(torch.bfloat16).double()
    lens = torch.tensor(lengths or [0, sk, sk + 5, sk // 2 + 1][:b], dtype=torch.int32)
    pages = -(-sk // page)
    total = b * pages + 3
    table = torch.randperm(total, generator=g)[:b * pages].view(b, pages).to(torch.int32)
    pool_k = torch.full((1, kvh, total * page, D), float("nan"), dtype=torch.float64)
    pool_v = pool_k.clone()
    for i in range(b):
        for r in range(min(int(lens[i]), sk)):
            at = int(table[i, r // page]) * page + r % page
            pool_k[0, :, at], pool_v[0, :, at] = kd[i, :, r], vd[i, :, r]
    runtime = {"seqlen_q": sq, "seqlen_k": sk, "scale": 1 / math.sqrt(D), "kv_lengths": lens, "block_table": table}
    return {"Q": q, "K": pool_k, "V": pool_v}, runtime


def interpreted(graph, tensors, runtime):
    b, h, sq, _ = tensors["Q"].shape
    return run_program(graph, dict(tensors, O=torch.full((b, h, sq, D), float("nan"), dtype=torch.float64)),
                       runtime)["O"]


def mismatch(got: torch.Tensor, want: torch.Tensor, tol: float = 1e-2) -> str:
    if (torch.isnan(got) != torch.isnan(want)).any():
        return f"{int(torch.isnan(got).sum())} NaN elements, the interpreter {int(torch.isnan(want).sum())}"
    err = (got - want).abs().max().item() if got.numel() else 0.0
    return "" if err <= tol * max(1.0, want.abs().max().item() if want.numel() else 1.0) else f"max error {err:.3e}"


# ------------------------------------------------------------------ meaning


@pytest.mark.parametrize("page", [16, 64, 128])
@pytest.mark.parametrize("sq, sk", [(1, 1), (17, 33), (70, 100)])
def test_the_interpreter_equals_attention_over_the_pages(page: int, sq: int, sk: int) -> None:
    graph, _, _, _ = lowered("sm_90", page)
    tensors, runtime = paged_inputs(4, 4, 2, sq, sk, page, sq * 7 + sk)
    want = paged_attention(tensors["Q"], tensors["K"], tensors["V"], scale=runtime["scale"],
                           kv_lengths=runtime["kv_lengths"], block_table=runtime["block_table"], seqlen_k=sk, page=page)
    assert mismatch(interpreted(graph, tensors, runtime), want, 1e-12) == ""


@pytest.mark.parametrize("page, bn", [(16, 32), (64, 64), (128, 32)])
@pytest.mark.parametrize("sq, sk", [(1, 1), (17, 33), (65, 63), (70, 9), (130, 97)])
def test_kernel_ir_equals_interpreter_on_sm90(page: int, bn: int, sq: int, sk: int) -> None:
    graph, kir, abi, _ = lowered("sm_90", page, bn)
    tensors, runtime = paged_inputs(4, 4, 2, sq, sk, page, sq * 131 + sk)
    got = evaluate_program(kir, abi, tensors, runtime)["O"]
    assert mismatch(got, interpreted(graph, tensors, runtime)) == ""


def test_a_table_entry_outside_the_pool_reads_zeros_in_both() -> None:
    graph, kir, abi, _ = lowered("sm_90")
    tensors, runtime = paged_inputs(2, 2, 2, 17, 40, 16, 5, lengths=[40, 40])
    runtime["block_table"] = runtime["block_table"].clone()
    runtime["block_table"][1, 1] = 10_000   # rows 16 … 31 of sequence 1: outside the pool
    runtime["block_table"][0, 2] = -3
    want = interpreted(graph, tensors, runtime)
    assert not torch.isnan(want).any()
    assert mismatch(evaluate_program(kir, abi, tensors, runtime)["O"], want) == ""


def _planted(program: K.ProgramOp, fn) -> K.ProgramOp:
    def walk(op: K.Op) -> K.Op:
        regions = {r: tuple(walk(c) for c in getattr(op, r)) for r in op.regions}
        return fn(dataclasses.replace(op, **regions) if regions else op)
    return walk(program)  # type: ignore[return-value]


def _wrong_map(op: K.Op) -> K.Op:
    if isinstance(op, K.GlobalTensorOp) and op.rows_at is not None:
        return dataclasses.replace(op, rows_at=E(str(op.rows_at).replace("row % 16", "(row + 1) % 16")))
    return op


def _wrong_first_row(op: K.Op) -> K.Op:
    if isinstance(op, K.AsyncCopyOp) and op.gather:
        return dataclasses.replace(op, gather_row0=E(f"{op.gather_row0} + 16"))
    return op


def _no_gather(op: K.Op) -> K.Op:
    if isinstance(op, K.AsyncCopyOp) and op.gather:
        return dataclasses.replace(op, gather="", gather_row0=None)
    return op


@pytest.mark.parametrize("plant", [_wrong_map, _wrong_first_row, _no_gather])
def test_a_planted_gather_bug_is_caught(plant) -> None:
    graph, kir, abi, _ = lowered("sm_90")
    tensors, runtime = paged_inputs(2, 2, 2, 17, 70, 16, 9, lengths=[70, 50])
    try:
        found = mismatch(evaluate_program(_planted(kir, plant), abi, tensors, runtime)["O"],
                         interpreted(graph, tensors, runtime))
    except TileEvalError as exc:
        found = exc.diagnostics[0].message
    assert found != ""


# ------------------------------------------------------------------ sm_90a, the CuTe, the launcher, the texts


def test_sm90a_keeps_cp_async_for_the_gathered_tiles_and_its_protocol_holds() -> None:
    _, kir, _, notes = lowered("sm_90a", 16, 64)
    assert any("row map" in str(n) and "gather" in str(n) for n in notes), notes
    copies = [op for op in K.walk(kir) if isinstance(op, K.AsyncCopyOp)]
    assert {op.gather for op in copies} >= {"mK", "mV"}
    assert protocol_problems(kir) == []


def test_the_emitted_cute_reads_each_row_from_its_page() -> None:
    source = emit_text(SPEC.read_bytes(), "paged.tl", "sm_90", small(16), "cute", line_directives=False)
    lines = [line.strip() for line in source.splitlines()]
    assert "int K_storage_rows;" in lines and "int* block_table_ptr;" in lines
    assert ("at_rows_[gm_] = int(((batch_idx >= 0 && batch_idx < p.batch && (tlc::floor_div(row_, 16) >= 0 && "
            "tlc::floor_div(row_, 16) < tlc::ceil_div(p.seqlen_k, 16))) ? p.block_table_ptr[batch_idx * "
            "tlc::ceil_div(p.seqlen_k, 16) + tlc::floor_div(row_, 16)] : 0) * 16 + row_ % 16);") in lines
    assert "if (get<0>(tKc32x32(0, gm_, 0)) < row_limit_ && at_ >= 0 && at_ < p.K_storage_rows) {" in lines \
        or any(line.startswith("if (get<0>(t") and "at_ < p.K_storage_rows" in line for line in lines)
    assert any("int64_t(at_ - row_) * stride<0>(mK)" in line for line in lines)
    # the pool has no batch offset: the map addresses the batch's rows itself
    assert any(line.startswith("Tensor mK = make_tensor(make_gmem_ptr(p.K_ptr + (tlc::floor_div(head_idx, group) * "
                               "p.K_head_stride))") for line in lines)


def test_the_launcher_binds_the_pool_and_refuses_one_per_sequence(monkeypatch) -> None:
    from bench.launch_stand_ins import no_gpu, record, stand_in_kernel

    no_gpu(monkeypatch.setattr)
    _, kir, abi, _ = lowered("sm_90a", 16, 64)
    kernel = stand_in_kernel(kir, abi)
    driver = record(monkeypatch.setattr, ctypes.sizeof(kernel._struct))
    q = torch.randn(2, 4, 40, D).to(torch.bfloat16)
    pool = torch.randn(1, 2, 7 * 16, D).to(torch.bfloat16)
    runtime = {"kv_lengths": torch.tensor([50, 3], dtype=torch.int32),
               "block_table": torch.tensor([[0, 1, 2, 3], [4, 5, 6, 0]], dtype=torch.int32)}
    out = kernel(q, pool, pool, seqlen_k=50, **runtime)
    assert tuple(out.shape) == (2, 4, 40, D)
    struct = kernel._struct.from_buffer_copy(driver.launches[-1][-1])
    assert (struct.K_storage_rows, struct.seqlen_k, struct.batch, struct.group) == (112, 50, 2, 2)
    with pytest.raises(TlcError, match=r"K is read through a row map \(rows at .*\): pass its storage, which the "
                                       r"batch shares, as \(1, heads, storage rows, cols\), got shape \(2, 2, 56, 32\)"):
        kernel(q, pool.view(2, 2, 56, D), pool, seqlen_k=50, **runtime)
    with pytest.raises(TlcError, match="seqlen_k"):   # no tensor gives the cache's length: it is an Input
        kernel(q, pool, pool, **runtime)


@pytest.mark.parametrize("arch", ["sm_90", "sm_90a"])
def test_kernel_ir_text_cache_codec_and_launch_abi_round_trip(arch: str) -> None:
    _, kir, abi, _ = lowered(arch)
    text = print_kir(kir)
    assert "rows_at=`load(p.block_table_ptr" in text and "gather=mK, gather_row0=" in text
    assert print_kir(parse_kir(text)) == text
    assert print_kir(decode(json.loads(json.dumps(encode({"p": kir}))))["p"]) == text
    assert LaunchABI.from_json(abi.name, json.loads(json.dumps(abi.to_json()))) == abi
    assert [t.rows_at != "" for t in abi.tensors] == [False, True, True, False]


# ------------------------------------------------------------------ the language


def test_fmt_keeps_the_row_map() -> None:
    text = SPEC.read_text()
    assert "and rows at block_table[batch_idx, row / PageSize] * PageSize + row % PageSize" in format_program(
        parse_text(text, "p.tl"))
    plain = text.replace("with offset head_idx / group and rows at", "with rows at", 1)
    assert "(min(kv_lengths[batch_idx], seqlen_k), HeadDim) with rows at block_table" in format_program(
        parse_text(plain, "p.tl"))


def errors(text: str) -> list[str]:
    try:
        lower_program(parse_text(text, "t.tl"))
    except TlcError as exc:
        return [f"{d.loc.line}: {d.message}" for d in exc.diagnostics if d.severity == "error" and d.loc is not None]
    return []


MAP = "and rows at block_table[batch_idx, row / PageSize] * PageSize + row % PageSize"


def line_of(start: str) -> int:
    return next(i for i, line in enumerate(SPEC.read_text().splitlines(), 1) if line.startswith(start))


K_LINE = line_of("Allocate K in global")


@pytest.mark.parametrize("old, new, line, message", [
    (MAP, "and rows at block_table[batch_idx, 0] * PageSize", K_LINE, "does not read 'row'"),
    (MAP, "and rows at row * 1.5", K_LINE, "'1.5' is not an integer"),
    (MAP, "and rows at row + blocks[batch_idx]", K_LINE, "indexes 'blocks', which is not declared"),
    ("Param PageSize = 16", "Param PageSize = 16\nParam row = 2", K_LINE + 1, "rename the Param, Input or loop"),
    ("Allocate Q in shared (BM, HeadDim)", "Allocate Q in shared (BM, HeadDim) with rows at row",
     line_of("Allocate Q in shared"),
     "'rows at' gathers the rows of a global (rows, cols) tensor; 'Q' is in shared memory"),
])
def test_what_a_row_map_cannot_be_is_refused_at_its_line(old: str, new: str, line: int, message: str) -> None:
    text = SPEC.read_text()
    assert old in text
    found = errors(text.replace(old, new, 1))
    assert any(e.startswith(f"{line}: ") and message in e for e in found), found


GATHER_INTO_REGISTERS = """Param dtype = bf16
Param BM = 64
Input seqlen_q : int
Input order : int32[seqlen_q]
Allocate X in global (seqlen_q, 64) as fp32 with rows at order[row]
Allocate Y in global (seqlen_q, 64) as fp32
Copy X (BM, 64) in coordinate [L = block_idx] from global to register
Compute Add X, 1 and get Y
Copy Y (BM, 64) in coordinate [L = block_idx] from register to global
"""


def test_a_gathered_tensor_loaded_into_registers_is_refused_at_its_line() -> None:
    graph, _ = compile_graph(GATHER_INTO_REGISTERS, "g.tl")
    x = torch.randn(1, 1, 5, 64, dtype=torch.float64)
    got = run_program(graph, {"X": x, "Y": torch.zeros(1, 1, 3, 64, dtype=torch.float64)},
                      {"seqlen_q": 3, "order": torch.tensor([4, 0, 9], dtype=torch.int32)})["Y"][0, 0]
    assert torch.equal(got, torch.stack([x[0, 0, 4], x[0, 0, 0], torch.zeros(64, dtype=torch.float64)]) + 1)
    with pytest.raises(TlcError, match="read through a row map, which the lowering gathers in copies to shared "
                                       "memory only") as info:
        run_lowering(graph, "sm_90", name="g")
    assert info.value.diagnostics[0].loc.line == 7


DEFERRED = """Param dtype = bf16
Param HeadDim = 64
Param BM = 64
Param Splits = 2
Input seqlen_q : int
Input order : int32[seqlen_q]
Allocate Q in global (seqlen_q, HeadDim) as fp32 with offset head_idx
Allocate X in global (seqlen_q, HeadDim) as fp32 with offset head_idx * Splits + s and rows at order[row]
Allocate O in global (seqlen_q, HeadDim) as fp32 with offset head_idx
Copy Q (BM, HeadDim) in coordinate [L = block_idx] from global to register
for s = 0:Splits
  Copy X (BM, HeadDim) in coordinate [L = block_idx] from global to register
  Compute Add Q, X and get new Q
end
Compute Add Q, 0 and get O
Copy O (BM, HeadDim) in coordinate [L = block_idx] from register to global
"""


def test_a_gathered_tensor_viewed_at_each_copy_is_refused_too() -> None:
    """Its head offset reads the loop's variable, so its view is made at the copy: still a row map (this once
    lowered to an affine register load of the storage's first rows)."""
    graph, _ = compile_graph(DEFERRED, "d.tl")
    with pytest.raises(TlcError, match="read through a row map, which the lowering gathers in copies to shared") as info:
        run_lowering(graph, "sm_90", name="d")
    assert info.value.diagnostics[0].loc.line == 12


def test_a_loop_variable_named_row_is_refused_beside_a_row_map() -> None:
    text = SPEC.read_text().replace("for n = 0:", "for row = 0:", 1).replace("[L = n]", "[L = row]")
    assert any("'row' names the tensor's own row in 'rows at'" in e for e in errors(text))


def test_the_program_launcher_takes_no_row_count_from_a_pool(monkeypatch) -> None:
    """The cache's length is an Input when only pools hold it: asked for, not taken from the pool's rows."""
    from bench.launch_stand_ins import no_gpu, record, stand_in_kernel
    from tlc.api import compile_module
    from tlc.backend_cute.launch_module import ModuleKernel
    from tlc.builder import lower_to_kernel_ir, module_kernel_name

    no_gpu(monkeypatch.setattr)
    spec = SPEC.parent / "paged_decode_fwd.tl"
    d = {"HeadDim": "64", "BM": "64", "BN": "64", "Splits": "2"}
    module, _ = compile_module(spec.read_text(), spec.name, defines=d, run_passes=False)
    states = {k: lower_to_kernel_ir(spec.read_bytes(), spec.name, "sm_90", d, name=module_kernel_name(spec.name, k),
                                    kernel=k)[0] for k in ("partial", "combine")}
    kernels = [(k, stand_in_kernel(st.kir, st.abi, "sm_90")) for k, st in states.items()]
    record(monkeypatch.setattr, None)
    program = ModuleKernel(kernels, module.roles())
    q, pool = torch.randn(2, 4, 1, 64).bfloat16(), torch.randn(1, 2, 7 * 16, 64).bfloat16()
    runtime = {"kv_lengths": torch.tensor([50, 3], dtype=torch.int32),
               "block_table": torch.tensor([[0, 1, 2, 3], [4, 5, 6, 0]], dtype=torch.int32)}
    with pytest.raises(TlcError, match="needs the runtime input 'seqlen_k'"):
        program(q, pool, pool, **runtime)
    program(q, pool, pool, seqlen_k=64, **runtime)
