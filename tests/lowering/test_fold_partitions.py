"""fold-partitions: partitions, fragments and tiled copies become flat views (tlc/layout), on by
default (TLC_FOLD_PARTITIONS=0 or fold-partitions{enable=false} turn it off). The folded kernel IR computes
what the interpreter says (tile evaluator, every case of test_tile_eval), prints and parses back,
and emits views instead of CuTe's partitioning; CuTe checks the views themselves in
tests/nvrtc/test_layout_engine_nvrtc.py."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tests.lowering.test_tile_eval import CASES, lowered, mismatch
from tlc.backend_cute.emit import emit_program
from tlc.kir import ops as K
from tlc.kir import ops_sm90 as H
from tlc.kir.ops_views import (AtomAsyncCopyOp, AtomCopyOp, CoordViewOp, CopyAtomOp, MmaAtomOp, RegisterFragmentOp,
                               RetileViewOp, ThreadViewOp, WgmmaDescriptorFragmentOp, WgmmaRegisterFragmentOp)
from tlc.kir.text import parse_kir, print_kir
from tlc.kir.transforms.fold_partitions import FoldPartitionsTransform, fold_partitions
from tlc.lowering.emit_text import kernel_ir

SPECS = Path(__file__).resolve().parents[2] / "specs"
SMALL = {"HeadDim": "32", "BM": "64", "BN": "32"}


def folded(program: K.ProgramOp) -> tuple[K.ProgramOp, list[str]]:
    kernel, notes = fold_partitions(program.kernels()[0])
    body = tuple(kernel if isinstance(op, K.KernelOp) else op for op in program.body)
    return K.ProgramOp(name=program.name, body=body), notes


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_folded_kernel_ir_equals_the_interpreter(case: str) -> None:
    _, kir, _ = lowered(case)
    program, notes = folded(kir)
    program.verify()
    assert any(isinstance(op, ThreadViewOp) for op in K.walk(program)), notes
    for sq, sk in [(17, 33), (65, 130)]:
        assert mismatch(case, sq, sk, program=program) == ""


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_partition_of_the_shipped_kernels_folds(case: str) -> None:
    """Every partition, fragment, tiled copy and TiledMMA: the ldmatrix sources too (CuTe's select spelling)."""
    _, kir, _ = lowered(case)
    program, notes = folded(kir)
    ops = list(K.walk(program))
    left = [op.name for op in ops if type(op) in (K.PartitionOp, K.FragmentOp, K.TiledCopyOp, K.TiledMmaOp)]
    assert left == [], notes
    assert print_kir(parse_kir(print_kir(program))) == print_kir(program)
    copies = [op for op in ops if isinstance(op, (K.CopyOp, K.AsyncCopyOp))]
    assert copies and all(isinstance(op, (AtomCopyOp, AtomAsyncCopyOp)) for op in copies), notes


@pytest.mark.parametrize("case", ["mha", "gqa_causal", "mla_prefill"])
def test_param_fold_ldmatrix_false_keeps_cutes_ldmatrix_sources(case: str) -> None:
    """And the tiled copies and the TiledMMA they need; the folded rest still equals the interpreter."""
    spec, defines, _ = CASES[case]
    program = kernel_ir(SPECS / f"{spec}.tl", "sm_90", {**defines, "FoldLdmatrix": "false"})
    kernel, notes = fold_partitions(program.kernels()[0], ldsm=False)   # idempotent: the pass ran already
    ops = list(K.walk(program))
    ldsm = {op.name for op in ops if type(op) is K.TiledCopyOp and op.kind in ("A", "B")}
    kept = [op for op in ops if type(op) is K.PartitionOp]
    assert ldsm and kept and all(op.method == "partition_S" and op.slice in {f"{c}_thr" for c in ldsm} for op in kept)
    assert all(f"{op.name}: kept (an ldmatrix source, by Param FoldLdmatrix = false)" in notes for op in kept)
    assert mismatch(case, 17, 33, program=program) == ""


def test_mha_views() -> None:
    program, notes = folded(kernel_ir(SPECS / "mha_fwd.tl", "sm_90", SMALL))
    ops = {op.name: op for op in K.walk(program) if isinstance(op, (ThreadViewOp, CoordViewOp, RetileViewOp,
                                                                     RegisterFragmentOp, CopyAtomOp, MmaAtomOp))}
    assert notes[0].startswith("fold-partitions: ") and "copies and MMAs as atoms" in notes[0]
    # cp.async at d=32: 32 rows × 4 threads of 8 contiguous bf16; rows step by the runtime row stride
    g = ops["tQgQ"]
    assert str(g.offset) == "threadIdx.x % 4 * 8 + threadIdx.x / 4 * p.Q_row_stride" and g.keep == 2
    assert g.layout_shape == ((8, 1), 2, 1) and str(g.layout_stride[1]) == "32 * p.Q_row_stride"
    # the same threads' shared side: 32 bf16 = 4 chunks per row, Swizzle<2,3,3>, base swizzle(offset)
    s = ops["tQsQ"]
    assert s.swizzle == (2, 3, 3) and str(s.offset) == "threadIdx.x * 8" and s.layout_stride == ((1, 0), 1024, 0)
    assert isinstance(ops["gmem_copy_32"], CopyAtomOp) and isinstance(ops["tiled_mma"], MmaAtomOp)
    c = ops["tSc64x32"]  # accumulator values: +1 column, +8 rows; then 4 n8 atoms
    assert str(c.row) == "threadIdx.x / 4 % 8 + threadIdx.x / 32 * 16" and str(c.col) == "threadIdx.x % 4 * 2"
    assert c.layout_stride == (((1, 1), (0, 8)), (0, 0), (1, 8))
    assert ops["rO"].layout_shape == ((2, 2), 1, 4) and ops["rO"].layout_stride == ((1, 2), 4, 4)
    cute = emit_program(program, line_directives=False)
    assert "partition_fragment" not in cute and "make_tiled_copy" not in cute   # every copy is an atom
    assert "TiledMMA<" not in cute and "cute::copy(" not in cute and "cute::gemm(" not in cute
    # the ldmatrix sources: the decayed swizzle's strides as CuTe spells them, a select on a bit of the offset
    q = next(line for line in cute.splitlines() if "Tensor tAsQ = " in line)
    assert q.startswith("  Tensor tAsQ = make_tensor(sQ.data() + (Swizzle<2, 3, 3>{}(int(") and " % 2 == 0 ? " in q
    assert "Swizzle<" in cute and "make_inttuple_iter(make_coord(" in cute
    # copies between views: loops calling the atom, the first rest mode fastest as in cute::copy
    assert "gmem_copy_32.call(tQgQ(_, i0_, i1_, block_idx, 0), tQsQ(_, i0_, i1_));" in cute
    assert cute.index("for (int i1_ = 0; i1_ < 1; ++i1_)") < cute.index("for (int i0_ = 0; i0_ < 2; ++i0_)")
    assert "s2r_A.call(tAsQ(_, i0_, kb + 1), tArQ_view(_, i0_, kb + 1));" in cute
    assert "tiled_mma.call(d_, tArQ(_, m_s, kb), tBrK(_, n_, kb), d_);" in cute
    # shared layouts: the static layout tlc computed, not CuTe's tile_to_shape
    assert "local_tile" not in cute and "tlc::ceil_div(int(size<0>(mQ)), 64)" in cute
    assert "tile_to_shape" not in cute and "using sQ_layout = decltype(composition(Swizzle<2, 3, 3>{}, Layout<" in cute
    assert emit_program(program, line_directives=False) == cute  # byte-deterministic


def test_the_pass_is_on_by_default_and_zero_turns_it_off(monkeypatch) -> None:
    monkeypatch.delenv("TLC_FOLD_PARTITIONS", raising=False)
    assert FoldPartitionsTransform().enable is True
    program = kernel_ir(SPECS / "mha_fwd.tl", "sm_90", SMALL)
    assert any(isinstance(op, ThreadViewOp) for op in K.walk(program))
    monkeypatch.setenv("TLC_FOLD_PARTITIONS", "0")
    assert FoldPartitionsTransform().enable is False
    program = kernel_ir(SPECS / "mha_fwd.tl", "sm_90", SMALL)
    assert not any(isinstance(op, ThreadViewOp) for op in K.walk(program))


@pytest.mark.parametrize("mode", ["1", "no-wgmma"])
def test_sm90a_kernels_fold_their_epilogue(monkeypatch, mode: str) -> None:
    """On sm_90a the engine models the epilogue's store to global memory (with its predicate's
    coordinates) and, unless TLC_FOLD_PARTITIONS=no-wgmma, the register→shared copy matched to the wgmma
    accumulator, the accumulators themselves (CuTe's partition_fragment_C layout, CLayout_64xN), the
    scores' coordinates for the masks and the shared operands' GMMA descriptors (their partitions
    dropped); under no-wgmma those stay CuTe's."""
    monkeypatch.setenv("TLC_FOLD_PARTITIONS", mode)
    defines = {"HeadDim": "64", "BM": "64", "BN": "64"}
    program = kernel_ir(SPECS / "mha_fwd.tl", "sm_90a", defines)
    views = {op.name for op in K.walk(program) if isinstance(op, (ThreadViewOp, CoordViewOp, RetileViewOp))}
    kept = {op.name for op in K.walk(program) if type(op) is K.PartitionOp}
    copies = [op.copy for op in K.walk(program) if isinstance(op, AtomCopyOp)]
    store = {"tOsO_out", "tOgO", "tOc64x64"}
    operands = {"tSsQ", "tSsK", "tOsV"}
    accumulators = {op.name: op for op in K.walk(program) if isinstance(op, H.WgmmaFragmentOp) and op.role == "C"}
    assert "rO" in accumulators and "acc_S" in accumulators
    descriptors = {op.name: op for op in K.walk(program) if isinstance(op, WgmmaDescriptorFragmentOp)}
    if mode == "1":
        assert views == store | {"tOsO", "tOrO", "tSc64x64"} and kept == set()
        assert set(descriptors) == {"tSrQ", "tSrK", "tOrV"}
        q, v = descriptors["tSrQ"], descriptors["tOrV"]   # 64x64 tiles, one warp group, bf16, 128-byte swizzle
        assert (q.src.name, q.desc_lo, q.desc_hi, q.layout_shape, q.layout_stride) == (
            "sQ", 1 << 16, 1 << 30 | 64, (1, 1, 4), (0, 0, 2))   # K-major: LBO 1, SBO 1024 B; k16 = 32 B
        # MN-major V at d = 64: one atom along N, so no leading offset (CuTe's too: tests/nvrtc checks it)
        assert (v.src.name, v.desc_lo, v.desc_hi) == ("sVt", 0, 1 << 30 | 64)
        assert copies == ["r2s_copy", "store_copy_64"]
        # universal copies between contiguous runs: plain moves (2 bf16 per 32-bit move; 8 per 128-bit one)
        vectors = {op.copy: op.vector for op in K.walk(program) if isinstance(op, AtomCopyOp)}
        assert vectors == {"r2s_copy": (32, 2, 16), "store_copy_64": (128, 8, 1)}, vectors
        cute = emit_program(program, line_directives=False)
        assert "*reinterpret_cast<uint32_t*>(&tOsO(v_ * 2, i0_, i1_)) = *reinterpret_cast<uint32_t const*>(" in cute
        assert ".call(" not in cute
        assert all(isinstance(op, WgmmaRegisterFragmentOp) for op in accumulators.values())
        assert accumulators["rO"].layout_shape == ((2, 2, 8), 1, 1)   # 64x64 on one warp group: 32 per thread
    else:
        assert views == store and kept == operands | {"tOsO", "tOrO", "tSc64x64"} and copies == ["store_copy_64"]
        assert not descriptors
        assert not any(isinstance(op, WgmmaRegisterFragmentOp) for op in accumulators.values())
    monkeypatch.setenv("TLC_FOLD_PARTITIONS", "0")
    unfolded = kernel_ir(SPECS / "mha_fwd.tl", "sm_90a", defines)
    assert not any(isinstance(op, (ThreadViewOp, CoordViewOp, RetileViewOp)) for op in K.walk(unfolded))


def test_a_universal_copy_becomes_moves_only_between_contiguous_runs() -> None:
    """The vector form needs both mode-0 slices to be runs of the atom's width (stride-1 first leaf);
    otherwise the copy keeps the atom's call (which handles any layout)."""
    from tlc.kir.expr import Var
    from tlc.layout.kir_atoms import _vector

    def view(name, shape, stride):
        return RetileViewOp(name=name, slice="s", method="retile_S", src=Var("r"), layout_shape=shape,
                            layout_stride=stride)
    atom = CopyAtomOp(name="c", atom="UniversalCopy<uint32_t>", dtype="bf16", kind="C", thread_slice="c_thr",
                      thread_layout=(), value_layout=(), mma="m")
    copy = K.CopyOp(copy="c", src=Var("a"), dst=Var("b"))
    runs = {"a": view("a", ((2, 8), 1), ((1, 2), 0)), "b": view("b", ((2, 8), 1), ((1, 64), 0))}
    assert _vector(copy, atom, runs) == (32, 2, 8)
    strided = dict(runs, b=view("b", ((2, 8), 1), ((64, 1), 0)))   # pairs of elements 64 apart
    assert _vector(copy, atom, strided) == ()
    wide = dataclasses.replace(atom, atom="SM80_CP_ASYNC_CACHEGLOBAL<cute::uint128_t>")
    assert _vector(copy, wide, runs) == ()
