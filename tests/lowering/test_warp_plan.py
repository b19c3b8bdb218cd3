"""The warp layouts of a block (tlc/lowering/warps.py): FlashAttention's one layout when the block
has 16 rows per warp; for fewer rows, scores replicated per warp group and the accumulated output
split by columns — and the uses of a column-split tile that cannot work refused at their line."""
from __future__ import annotations

from pathlib import Path

import pytest

from tlc.api import compile_graph
from tlc.diagnostics import TlcError
from tests.lowering.programs import gemms
from tlc.kir.ops import TiledMmaOp, walk
from tlc.lowering.emit_text import emit_text
from tlc.lowering.passes import run_lowering
from tlc.lowering.resources import register_fragments

SPECS = Path(__file__).resolve().parents[2] / "specs"
DECODE = (SPECS / "mla_decode_fwd.tl").read_text()


def _kernel(text: str, defines: dict[str, str]):
    graph, _ = compile_graph(text, "decode.tl", defines=defines)
    state, _ = run_lowering(graph, "sm_90", name="decode")
    return state.kir


def _mmas(kir) -> dict[str, TiledMmaOp]:
    return {op.name: op for op in walk(kir) if isinstance(op, TiledMmaOp)}


def test_rows_per_warp_keep_one_layout():
    mmas = _mmas(_kernel(DECODE, {"BM": "64", "DQK": "64", "DV": "64"}))
    assert list(mmas) == ["tiled_mma"] and mmas["tiled_mma"].warps == (4, 1, 1) and mmas["tiled_mma"].replicas == 1


@pytest.mark.parametrize("bm, warps, replicas", [(16, 4, 4), (32, 4, 2), (32, 8, 4), (64, 8, 2)])
def test_fewer_rows_replicate_scores_and_split_the_output(bm, warps, replicas):
    kir = _kernel(DECODE, {"BM": str(bm), "Warps": str(warps), "DQK": "64", "DV": str(16 * replicas * 2)})
    mmas = _mmas(kir)
    rows = bm // 16
    assert mmas["tiled_mma"].warps == (rows, 1, 1) and mmas["tiled_mma"].replicas == replicas
    assert mmas["tiled_mma_n"].warps == (rows, replicas, 1) and mmas["tiled_mma_n"].replicas == 1
    (s_gemm, _), (o_gemm, _) = gemms(kir)
    assert (s_gemm.mma, o_gemm.mma) == ("tiled_mma", "tiled_mma_n")


def test_the_real_decode_widths_fit_the_registers():
    """576/512 at 16 rows: O is 16 × 512 / 128 threads = 64 fp32 registers, not 256."""
    kir = _kernel(DECODE, {})
    kernel = next(op for op in kir.body if op.__class__.__name__ == "KernelOp")
    frags, _, peak = register_fragments(kernel)
    regs = {f.name: f.regs for f in frags}
    assert regs["rO"] == 64 and regs["acc_S"] == 16 and peak < 200


def test_replicated_mma_threads_wrap_in_the_emitted_source():
    src = emit_text(DECODE.encode(), "decode.tl", "sm_90", {"FoldLdmatrix": "false"}, "cute", line_directives=False)
    assert "auto thr_mma = tiled_mma.get_slice(threadIdx.x % 32);" in src
    assert "auto thr_mma_n = tiled_mma_n.get_slice(threadIdx.x);" in src
    assert "s2r_B_trans.get_thread_slice(threadIdx.x);" in src  # V is read per column slice by every warp


def _refused(text: str, line_text: str, words: str) -> None:
    with pytest.raises(TlcError) as exc:
        _kernel(text, {"DQK": "64", "DV": "64"})
    diag = exc.value.diagnostics[0]
    assert words in diag.message
    assert diag.loc is not None and line_text in text.splitlines()[diag.loc.line - 1]


def test_a_row_reduction_of_the_split_output_is_refused():
    text = DECODE.replace("Compute Divide O, l and get new O",
                          "Compute Divide O, l and get new O\nCompute Softmax O and get new O")
    _refused(text, "Compute Softmax O", "split across warps")


def test_storing_a_replicated_tile_is_refused():
    text = DECODE.replace("Allocate O in register (BM, DV)", "Allocate O in register (BM, DV)\n"
                          "Allocate S2 in global (seqlen_q, BN) with offset head_idx") \
                 .replace("  Compute GEMM P, V and accumulate O",
                          "  Compute GEMM P, V and accumulate O\n  Copy S (BM, BN) in coordinate [L = block_idx] "
                          "from register to global")
    with pytest.raises(TlcError):
        _kernel(text, {"DQK": "64", "DV": "64"})


def test_rows_that_do_not_divide_the_warps_are_refused():
    with pytest.raises(TlcError) as exc:
        _kernel(DECODE, {"BM": "48", "Warps": "4", "DQK": "64", "DV": "64"})
    assert "48 rows on 4 warps" in exc.value.diagnostics[0].message
