"""lower-tile-ops reads the specialization from the TL program — tiles, dtype, head offsets, and
every Compute on the scores between the two GEMMs, each at its own line — and the launcher binds
the program's runtime Inputs. (These were select-atoms' tests; select-atoms is gone, the
intents are kept against the per-op lowering.)"""
from __future__ import annotations

from pathlib import Path

import pytest

from tlc.api import compile_graph, lower_source
from tlc.backend_cute.emit import emit_program
from tlc.diagnostics import TlcError
from tlc.kir.ops import (AllReduceOp, Exp2ScaleOp, LetOp, MapOp, MaskOp, RowBroadcastOp, RowReduceOp,
                         SmemLayoutOp, TiledMmaOp, walk)
from tlc.kir.text import parse_kir, print_kir
from tlc.lowering.passes import run_lowering
from tlc.lowering.tile_ops import LOG2E

SPECS = Path(__file__).resolve().parents[2] / "specs"
B2B_RELU = "Compute Relu S and get new S"


def _lower(name: str, text: str | None = None, arch: str = "sm_90", **defines: str):
    """The lowering state of a spec (or of `text` under the spec's file name), after the TL passes."""
    path = SPECS / name
    graph, _ = compile_graph((text or path.read_text()).encode(), str(path), defines=defines)
    state, _ = run_lowering(graph, arch, name=Path(name).stem)
    return state


def _ops(state, cls) -> list:
    """The kernel IR's distinct ops of `cls` in program order (split-masked-trips repeats a loop body)."""
    return list(dict.fromkeys(op for op in walk(state.kir) if isinstance(op, cls)))


def _layout(state, name: str) -> SmemLayoutOp:
    return next(op for op in _ops(state, SmemLayoutOp) if op.name == name)


def _lines(name: str) -> dict[str, int]:
    text = (SPECS / name).read_text().splitlines()
    return {line.strip(): i + 1 for i, line in enumerate(text)}


def test_mha_defaults_reach_the_kernel_ir() -> None:
    s = _lower("mha_fwd.tl")
    (mma,) = _ops(s, TiledMmaOp)
    assert mma.atom == "SM80_16x8x16_F32BF16BF16F32_TN" and mma.warps == (4, 1, 1) and mma.tile[0] == 64
    assert _layout(s, "sQ_layout").shape == (128, 128) and _layout(s, "sK_layout").shape == (64, 128, 2)
    assert [(t.name, t.dtype, t.cols) for t in s.abi.tensors] == [("Q", "bf16", 128), ("K", "bf16", 128),
                                                                   ("V", "bf16", 128), ("O", "bf16", 128)]
    assert not any(m.causal for m in _ops(s, MaskOp))


def test_defines_reach_the_kernel_ir() -> None:
    s = _lower("mha_fwd.tl", HeadDim="64", BN="32", Causal="true", dtype="fp16")
    (mma,) = _ops(s, TiledMmaOp)
    assert mma.atom == "SM80_16x8x16_F32F16F16F32_TN"
    assert _layout(s, "sK_layout").shape == (32, 64, 2)
    assert {(t.dtype, t.cols) for t in s.abi.tensors} == {("fp16", 64)}
    assert [(m.causal, m.alignment) for m in _ops(s, MaskOp) if m.causal] == [(True, "top_left")]


def test_gqa_head_offset_reaches_the_abi_and_the_kernel() -> None:
    s = _lower("gqa_fwd.tl")
    heads = {t.name: t.head for t in s.abi.tensors}
    assert heads["Q"] == heads["O"] == "head_idx" and "group" in heads["K"] and "group" in heads["V"]
    src = emit_program(s.kir, line_directives=False)
    assert "p.K_ptr + (batch_idx * p.K_batch_stride + tlc::floor_div(head_idx, group) * p.K_head_stride)" in src
    assert "p.Q_ptr + (batch_idx * p.Q_batch_stride + head_idx * p.Q_head_stride)" in src


def test_implicit_softmax_asks_for_the_tl_passes() -> None:
    """Without online-softmax the loop exports its scores: refused at the loop, naming the fix."""
    graph = lower_source((SPECS / "mha_fwd.tl").read_bytes(), "mha_fwd.tl")
    with pytest.raises(TlcError, match="run the TL passes") as exc:
        run_lowering(graph, "sm_90", name="mha_fwd")
    assert exc.value.diagnostics[0].loc.line == _lines("mha_fwd.tl")["for n = 0:seqlen_k / BN"]


def test_unsupported_arch_is_a_clear_error() -> None:
    with pytest.raises(TlcError, match="unknown target 'sm_75'.*sm_80"):
        _lower("mha_fwd.tl", arch="sm_75")


# ----------------------------------------------------------------------------- the scores
def test_mha_scores_are_masks_and_the_scale_is_in_the_softmax() -> None:
    s = _lower("mha_fwd.tl", Causal="true")
    mask_line = _lines("mha_fwd.tl")["Compute Mask S causal Align and get new S when Causal"]
    assert [(m.causal, m.bounds, m.loc.line) for m in _ops(s, MaskOp)] == [(True, False, mask_line),
                                                                          (False, True, mask_line + 1)]
    # online-softmax folded `Multiply S, scale` into the exp2 scale: no multiply of the scores is left
    assert not [m for m in _ops(s, MapOp) if m.target == "acc_S"]
    (exp2,) = _ops(s, Exp2ScaleOp)
    scale = next(op for op in _ops(s, LetOp) if op.name == str(exp2.scale_log2))
    assert str(scale.value) == f"p.scale * {LOG2E!r}"


def test_softcap_computes_lower_in_program_order_at_their_lines() -> None:
    s = _lower("softcap_fwd.tl", Causal="true")
    lines = _lines("softcap_fwd.tl")
    got = [(str(m.fn), m.loc.line) for m in _ops(s, MapOp) if m.target == "acc_S"]
    assert got == [("x0 * scale", lines["Compute Multiply S, scale and get new S"]),
                   ("select(Softcap == 0.0, 0.0, x0 / Softcap)", lines["Compute Divide S, Softcap and get new S"]),
                   ("tanh(x0)", lines["Compute Tanh S and get new S"])]
    # the final `Multiply S, Softcap` is folded into the exp2 scale (online-softmax), a constant here
    (exp2,) = _ops(s, Exp2ScaleOp)
    folded = next(op for op in _ops(s, LetOp) if op.name == str(exp2.scale_log2))
    assert float(str(folded.value)) == pytest.approx(30.0 * LOG2E)
    assert [m.loc.line for m in _ops(s, MaskOp) if m.causal] == [lines["Compute Mask S causal Align and get new S when Causal"]]


def test_softcap_defines_reach_the_scalars() -> None:
    s = _lower("softcap_fwd.tl", Softcap="50.0", Causal="true")
    cap = next(op for op in _ops(s, LetOp) if op.name == "Softcap")
    assert float(str(cap.value)) == 50.0
    (exp2,) = _ops(s, Exp2ScaleOp)
    folded = next(op for op in _ops(s, LetOp) if op.name == str(exp2.scale_log2))
    assert float(str(folded.value)) == pytest.approx(50.0 * LOG2E)
    src = emit_program(s.kir, line_directives=False)
    mul, tanh, mask = (src.index(t) for t in ("acc_S(i) = x0 * scale;", "acc_S(i) = tanhf(x0);", "col > row"))
    assert mul < tanh < mask


def test_b2b_has_relu_and_no_softmax() -> None:
    s = _lower("b2b_gemm_relu.tl")
    relu = [m for m in _ops(s, MapOp) if m.target == "acc_S"]
    assert [(str(m.fn), m.loc.line) for m in relu] == [("max(x0, 0.0)", _lines("b2b_gemm_relu.tl")[B2B_RELU])]
    for cls in (RowReduceOp, AllReduceOp, Exp2ScaleOp, RowBroadcastOp, MaskOp):
        assert not _ops(s, cls), cls.__name__
    assert [t.name for t in s.abi.tensors] == ["A", "B", "C", "O"] and s.abi.inputs == (("seqlen_q", "int"),
                                                                                       ("seqlen_k", "int"))
    assert print_kir(parse_kir(print_kir(s.kir))) == print_kir(s.kir)
    src = emit_program(s.kir, source="b2b_gemm_relu.tl")
    assert "acc_S(i) = tlc::max(x0, 0.0f);" in src and f'#line {relu[0].loc.line} "b2b_gemm_relu.tl"' in src
    assert "exp2f" not in src and "__shfl_xor_sync" not in src


@pytest.mark.parametrize("stmt, fn", [
    ("Compute Multiply S, 2.0 and get new S", "x0 * c"),
    ("Compute Divide S, 4.0 and get new S", "select(c == 0.0, 0.0, x0 / c)"),  # LANGUAGE.md: x / 0 is 0
    ("Compute Exp S and get new S", f"exp2(x0 * {LOG2E!r})"),
    ("Compute Subtract S, seqlen_k and get new S", "x0 - seqlen_k"),
    ("Compute Max S, 0.5 and get new S", "max(x0, c)"),
    ("Compute Sqrt S and get new S", "sqrt(x0)"),              # the template refused sqrt; the lowering has it
    ("Compute Multiply S, S and get new S", "x0 * x1"),        # a tile operand, refused by the template
])
def test_each_compute_on_the_scores_is_one_map_at_its_line(stmt: str, fn: str) -> None:
    text = (SPECS / "b2b_gemm_relu.tl").read_text().replace(B2B_RELU, stmt)
    line = _lines("b2b_gemm_relu.tl")[B2B_RELU]
    maps = [m for m in _ops(_lower("b2b_gemm_relu.tl", text), MapOp) if m.loc and m.loc.line == line]
    assert [str(m.fn) for m in maps] == [fn]


def test_a_compute_on_mismatched_tiles_is_refused_at_its_line() -> None:
    text = (SPECS / "b2b_gemm_relu.tl").read_text().replace(B2B_RELU, "Compute Multiply S, O and get new S")
    with pytest.raises(TlcError) as exc:
        _lower("b2b_gemm_relu.tl", text, K1="64", N2="32", BN="64")
    d = exc.value.diagnostics[0]
    assert "different shapes" in d.message and d.loc.line == _lines("b2b_gemm_relu.tl")[B2B_RELU]


# ----------------------------------------------------------------------------- the launcher
def test_launcher_binds_runtime_inputs_by_name() -> None:
    """A program's own float Input reaches the parameter struct; the launcher asks for it by name."""
    torch = pytest.importorskip("torch")
    from tlc.backend_cute.compile import CompiledKernel
    from tlc.backend_cute.launch import Kernel

    text = (SPECS / "mha_fwd.tl").read_text()
    text = text.replace("Input scale : float", "Input scale, bias : float").replace(
        "  Compute Multiply S, scale and get new S\n",
        "  Compute Multiply S, scale and get new S\n  Compute Add S, bias and get new S\n")
    s = _lower("mha_fwd.tl", text, HeadDim="64")
    assert ("bias", "f32") in s.kir.body[0].fields
    kern = Kernel(CompiledKernel(s.kir, "sm_90", "", b"", {}, 0.0), s.abi)
    assert [t.name for t in kern.inputs] == ["Q", "K", "V"] and [t.name for t in kern.outputs] == ["O"]
    q, k, v = torch.empty(2, 4, 33, 64), torch.empty(2, 4, 70, 64), torch.empty(2, 4, 70, 64)
    env, dims = kern._bind((q, k, v), {"bias": 3})
    assert env == {"seqlen_q": 33, "seqlen_k": 70, "scale": pytest.approx(64 ** -0.5), "bias": 3.0}
    assert dims == {"batch": 2, "heads": 4, "group": 1}
    with pytest.raises(TlcError, match="needs the runtime input 'bias': pass bias=<value>"):
        kern._bind((q, k, v), {})
    with pytest.raises(TlcError, match="V has 69 rows but an earlier tensor gave seqlen_k = 70"):
        kern._bind((q, k, torch.empty(2, 4, 69, 64)), {"bias": 1.0})
