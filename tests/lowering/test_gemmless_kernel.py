"""A kernel without GEMMs (specs/merge_states.tl: two partial attention states merged, the split-KV combine):
its register tiles and row vectors loaded from global memory straight into registers (FragLoadOp, RowLoadOp),
laid out like an accumulator of the sm_80 family's row TiledMMA on every target (sm_90a included: no wgmma, so
nothing of warp groups or TMA applies); the kernel IR on the tile evaluator equal to the interpreter at odd sizes
for both targets (planted bugs caught), the emitted CuTe, fp32 inputs and vector inputs through the launcher
on the CPU, and the refusals at their lines. GPU: tests/gpu (merge64, merge128)."""
from __future__ import annotations

import ctypes
import dataclasses
from functools import lru_cache
from pathlib import Path

import pytest
import torch

from tlc.api import compile_graph
from tlc.diagnostics import TlcError
from tlc.ir.interpreter import run_program
from tlc.kir import ops as K
from tlc.kir import ops_sm90 as H
from tlc.kir.expr import Const
from tlc.kir.tile_eval import evaluate_program
from tlc.lowering.emit_text import emit_text
from tlc.lowering.passes import run_lowering

SPEC = Path(__file__).resolve().parents[2] / "specs" / "merge_states.tl"
SMALL = {"HeadDim": "32"}


@lru_cache(maxsize=None)
def lowered(arch: str, text: str | None = None, defines: tuple = ()):
    graph, _ = compile_graph(text or SPEC.read_text(), "merge.tl", defines=dict(SMALL, **dict(defines)))
    state, _ = run_lowering(graph, arch, name="merge")
    return graph, state.kir, state.abi


def inputs(sq: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed * 100 + sq)
    t = {n: torch.randn(2, 3, sq, 32, generator=g).float().double() for n in ("O_a", "O_b")}
    t.update({n: (4 * torch.randn(2, 3, sq, generator=g)).float().double() for n in ("LSE_a", "LSE_b")})
    return t


def mismatch(arch: str, sq: int, program: K.ProgramOp | None = None) -> str:
    graph, kir, abi = lowered(arch)
    t = inputs(sq)
    given = dict(t, O=torch.full((2, 3, sq, 32), float("nan"), dtype=torch.float64),
                 LSE=torch.full((2, 3, sq), float("nan"), dtype=torch.float64))
    want = run_program(graph, given, {"seqlen_q": sq})
    got = evaluate_program(program or kir, abi, t, {"seqlen_q": sq})
    for name, tol in (("O", 1e-2), ("LSE", 1e-5)):
        if (torch.isnan(got[name]) != torch.isnan(want[name])).any():
            return f"{name}: {int(torch.isnan(got[name]).sum())} NaN, the interpreter {int(torch.isnan(want[name]).sum())}"
        err = (got[name] - want[name]).abs().max().item()
        if err > tol * max(1.0, want[name].abs().max().item()):
            return f"{name}: max error {err:.3e}"
    return ""


@pytest.mark.parametrize("sq", [1, 17, 64, 65, 130])
@pytest.mark.parametrize("arch", ["sm_90", "sm_90a"])
def test_kernel_ir_equals_interpreter(arch: str, sq: int) -> None:
    assert mismatch(arch, sq) == ""


def test_sm90a_lowers_it_by_the_sm80_family_rules() -> None:
    _, kir, _ = lowered("sm_90a")
    (kernel,) = kir.kernels()
    assert not isinstance(kernel, H.Sm90KernelOp)
    mmas = [op for op in K.walk(kir) if isinstance(op, K.TiledMmaOp)]
    assert [m.atom for m in mmas] == ["SM80_16x8x16_F32BF16BF16F32_TN"]
    assert not any(isinstance(op, (K.MmaOp, K.AsyncCopyOp)) or type(op).__module__.endswith("ops_sm90")
                   for op in K.walk(kir) if not isinstance(op, (K.KernelOp, K.ProgramOp)))   # O's store stages in shared


def test_the_abi_takes_fp32_tensors_and_vectors() -> None:
    _, _, abi = lowered("sm_90")
    got = {t.name: (t.dtype, t.cols, t.output) for t in abi.tensors}
    assert got == {"O_a": ("fp32", 32, False), "LSE_a": ("fp32", 0, False), "O_b": ("fp32", 32, False),
                   "LSE_b": ("fp32", 0, False), "O": ("bf16", 32, True), "LSE": ("fp32", 0, True)}


def _replace(program: K.ProgramOp, cls: type, **changes) -> K.ProgramOp:
    def walk(op: K.Op) -> K.Op:
        regions = {r: tuple(walk(c) for c in getattr(op, r)) for r in op.regions}
        op = dataclasses.replace(op, **regions) if regions else op
        return dataclasses.replace(op, **changes) if isinstance(op, cls) else op
    return walk(program)  # type: ignore[return-value]


@pytest.mark.parametrize("cls", [K.FragLoadOp, K.RowLoadOp])
def test_a_planted_load_limit_is_caught(cls: type) -> None:
    _, kir, _ = lowered("sm_90")
    assert mismatch("sm_90", 65, _replace(kir, cls, row_limit=Const(1))) != ""


def test_emitted_cute_loads_each_lanes_elements() -> None:
    source = emit_text(SPEC.read_bytes(), "merge.tl", "sm_90", SMALL, "cute", line_directives=False)
    lines = [line.strip() for line in source.splitlines()]
    assert "Tensor gO_a_in = local_tile(mO_a, Shape<Int<64>, Int<32>>{}, make_coord(block_idx, 0));" in lines
    assert "rO_a(i) = (row < row_limit_) ? static_cast<float>(gO_a_in(row, col)) : 0.f;" in lines
    assert "LSE_a(mi) = row < row_limit_ ? static_cast<float>(gLSE_a_rows(row)) : 0.f;" in lines
    assert "float* O_a_ptr;" in lines and "float* LSE_b_ptr;" in lines


def test_the_launcher_takes_fp32_tensors_and_vectors(monkeypatch) -> None:
    from bench.launch_stand_ins import no_gpu, record, stand_in_kernel

    no_gpu(monkeypatch.setattr)
    _, kir, abi = lowered("sm_90a")
    kernel = stand_in_kernel(kir, abi)
    driver = record(monkeypatch.setattr, ctypes.sizeof(kernel._struct))
    t = {k: v.float() for k, v in inputs(33).items()}
    o, lse = kernel(t["O_a"], t["LSE_a"], t["O_b"], t["LSE_b"])
    assert (o.shape, o.dtype, lse.shape, lse.dtype) == ((2, 3, 33, 32), torch.bfloat16, (2, 3, 33), torch.float32)
    struct = kernel._struct.from_buffer_copy(driver.launches[-1][-1])
    assert struct.LSE_a_ptr == t["LSE_a"].data_ptr() and (struct.LSE_a_head_stride, struct.LSE_a_row_stride) == (33, 1)
    with pytest.raises(TlcError, match=r"LSE_a is a vector per \(batch, head\): it must be 3-D"):
        kernel(t["O_a"], t["O_a"], t["O_b"], t["LSE_b"])
    with pytest.raises(TlcError, match="O_a has dtype torch.bfloat16; this kernel was built for torch.float32"):
        kernel(t["O_a"].bfloat16(), t["LSE_a"], t["O_b"], t["LSE_b"])


@pytest.mark.parametrize("old, new, line, words", [
    ("Param BM = 64", "Param BM = 96", 28, "a register tile of 96 rows on 4 warps; each warp holds 16 rows"),
    # LSE's rows would come from two loads of different rows: refused where it is stored
    ("Copy LSE_a (BM) in coordinate [L = block_idx] from", "Copy LSE_a (BM) in coordinate [L = block_idx from end] from",
     45, "cannot tell which rows the row vector 'LSE' holds"),
    ("Allocate O_a in global (seqlen_q, HeadDim) as fp32", "Allocate O_a in global (seqlen_q, HeadDim) as fp16", 28,
     None),
])
def test_what_a_register_load_cannot_be_is_refused_at_its_line(old: str, new: str, line: int, words: str | None) -> None:
    text = SPEC.read_text()
    assert old in text
    if words is None:   # a bf16/fp16 tensor loads into registers as well, converted to fp32
        lowered("sm_90", text.replace(old, new))
        return
    with pytest.raises(TlcError) as info:
        lowered("sm_90", text.replace(old, new))
    messages = [f"{d.loc.line}: {d.message}" for d in info.value.diagnostics]
    assert any(m.startswith(f"{line}: ") and words in m for m in messages), messages


def test_a_register_load_in_a_kernel_with_gemms_is_refused_at_its_line() -> None:
    from tlc.builder import lower_to_kernel_ir
    text = (Path(SPEC).parents[0] / "mha_fwd.tl").read_text().replace(
        "Compute Multiply S, scale and get new S",
        "Copy B (BM, BN) in coordinate [L = block_idx, C = n] from global to register\n"
        "  Compute Add S, B and get new S").replace(
        "Allocate O in global (seqlen_q, HeadDim) with offset head_idx",
        "Allocate O in global (seqlen_q, HeadDim) with offset head_idx\nAllocate B in global (seqlen_q, seqlen_k)")
    with pytest.raises(TlcError, match="reads 'B', a tile copied to registers from global memory; .* in a kernel with GEMMs"):
        lower_to_kernel_ir(text.encode(), "bias.tl", "sm_90", {"HeadDim": "64"}, name="bias")


@pytest.mark.parametrize("coord_b", ["block_idx + 1", "block_idx from end", "0"])
def test_a_tile_whose_rows_come_from_two_loads_of_other_rows_is_refused(coord_b: str) -> None:
    """Found by review: `Add X, Z` of tiles loaded at two coordinates was stored unchecked; the kernel's zero-filled
    rows then reached rows the program leaves absent."""
    text = SPEC.read_text().replace("Copy O_b (BM, HeadDim) in coordinate [L = block_idx]",
                                    f"Copy O_b (BM, HeadDim) in coordinate [L = {coord_b}]")
    with pytest.raises(TlcError, match="the rows of 'O' come from loads of different rows"):
        lowered("sm_90", text)


def test_an_explicit_input_that_disagrees_with_the_tensors_is_refused(monkeypatch) -> None:
    """Found by review: `seqlen_q=4000` with 33-row tensors went into the struct (a 63-tile grid, reads past the
    ends); the tile evaluator refused it, the launcher did not."""
    from bench.launch_stand_ins import no_gpu, record, stand_in_kernel

    no_gpu(monkeypatch.setattr)
    _, kir, abi = lowered("sm_90a")
    kernel = stand_in_kernel(kir, abi)
    record(monkeypatch.setattr, ctypes.sizeof(kernel._struct))
    t = {k: v.float() for k, v in inputs(33).items()}
    with pytest.raises(TlcError, match=r"seqlen_q = 4000 was given, but the tensors have 33 rows there \(O_a, LSE_a"):
        kernel(t["O_a"], t["LSE_a"], t["O_b"], t["LSE_b"], seqlen_q=4000)


@pytest.mark.parametrize("arch", ["sm_90", "sm_90a"])
def test_a_row_vector_allocate_in_a_kernel_with_gemms_lowers(arch: str) -> None:
    """Found by review: on sm_90a its rows were checked against mma.sync's warp layout, which a wgmma plan has not
    (an internal error)."""
    from tlc.builder import lower_to_kernel_ir
    text = (Path(SPEC).parent / "mha_lse_fwd.tl").read_text().replace(
        "Allocate O in register (BM, HeadDim)", "Allocate O in register (BM, HeadDim)\nAllocate z in register (BM)")
    lower_to_kernel_ir(text.encode(), "lse.tl", arch, {"HeadDim": "64"}, name="lse")
