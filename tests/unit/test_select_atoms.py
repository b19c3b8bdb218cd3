"""select-atoms reads the specialization — including the program on the scores between the two
GEMMs — from the TL program, and refuses what it cannot lower."""
from __future__ import annotations

from pathlib import Path

import pytest

from tlc.api import compile_graph, lower_source
from tlc.backend_cute.emit import emit_program
from tlc.diagnostics import TlcError
from tlc.kir.flash_fwd import FlashFwdConfig, build_flash_fwd_kir
from tlc.kir.ops import (AllReduceOp, Exp2ScaleOp, MapOp, MaskOp, RowBroadcastOp, RowReduceOp, RowVectorOp,
                         walk)
from tlc.kir.score_ops import LOG2E, TLScoreOp, lower_score_ops
from tlc.kir.text import parse_kir, print_kir
from tlc.lowering.select_atoms import flash_config, select_attention

SPECS = Path(__file__).resolve().parents[2] / "specs"


def _shape(name: str, arch: str = "sm_90", **defines: str):
    path = SPECS / name
    graph, _ = compile_graph(path.read_bytes(), name, defines=defines)
    return select_attention(graph, arch)


def _passed(name: str, **defines: str):
    """select-atoms on the graph after the TL passes (what `tlc build` lowers)."""
    path = SPECS / name
    graph, _ = compile_graph(path.read_bytes(), str(path), defines=defines)
    return select_attention(graph, "sm_90")


def _lines(name: str) -> dict[str, int]:
    text = (SPECS / name).read_text().splitlines()
    return {line.strip(): i + 1 for i, line in enumerate(text)}


def test_mha_defaults() -> None:
    s = _shape("mha_fwd.tl")
    assert (s.dtype, s.d_qk, s.d_v, s.bm, s.bn, s.causal) == ("bf16", 128, 128, 128, 64, False)


def test_defines_reach_the_specialization() -> None:
    s = _shape("mha_fwd.tl", HeadDim="64", BN="32", Causal="true")
    assert (s.dtype, s.d_qk, s.bn, s.causal, s.alignment) == ("bf16", 64, 32, True, "top_left")


def test_gqa_offset_is_recorded() -> None:
    assert "group" in _shape("gqa_fwd.tl").kv_offset


def test_implicit_softmax_asks_for_the_tl_passes() -> None:
    graph = lower_source((SPECS / "mha_fwd.tl").read_bytes(), "mha_fwd.tl")
    with pytest.raises(TlcError, match="online-softmax"):
        select_attention(graph, "sm_90")


def test_unsupported_arch_is_a_clear_error() -> None:
    with pytest.raises(TlcError, match="unsupported --arch sm_75"):
        _shape("mha_fwd.tl", arch="sm_75")


# ----------------------------------------------------------------------------- score programs
def test_mha_scores_are_masks_and_the_scale_is_in_the_softmax() -> None:
    s = _passed("mha_fwd.tl", Causal="true")
    lines = _lines("mha_fwd.tl")
    assert [(op.fn, op.kind) for op in s.score_ops] == [("mask", "causal"), ("mask", "bounds")]
    assert s.score_ops[0].loc.line == lines["Compute Mask S causal Align and get new S when Causal"]
    assert s.softmax and s.normalize and s.exp2_scale == f"scale * {LOG2E!r}"
    assert s.tensor_names == ("Q", "K", "V", "O") and not s.softcap


def test_softcap_scores_come_from_the_computes_on_s() -> None:
    s = _passed("softcap_fwd.tl")
    lines = _lines("softcap_fwd.tl")
    got = [(op.fn, op.scalar, op.loc.line) for op in s.score_ops]
    assert got == [("mul", "scale", lines["Compute Multiply S, scale and get new S"]),
                   ("div", "30.0", lines["Compute Divide S, Softcap and get new S"]),
                   ("tanh", None, lines["Compute Tanh S and get new S"]),
                   ("mask", None, lines["Compute Softmax S with max m, sum l and get P"])]
    # online-softmax folded the final multiply by Softcap into the exp2 scale
    assert s.softmax and s.normalize and s.exp2_scale == f"30.0 * {LOG2E!r}" and s.softcap


def test_softcap_defines_reach_the_scalars() -> None:
    s = _passed("softcap_fwd.tl", Softcap="50.0", Causal="true")
    assert [op.scalar for op in s.score_ops if op.fn == "div"] == ["50.0"]
    assert s.causal and s.exp2_scale == f"50.0 * {LOG2E!r}"


def test_b2b_has_relu_and_no_softmax() -> None:
    s = _passed("b2b_gemm_relu.tl")
    assert [(op.fn, op.loc.line) for op in s.score_ops] == [("relu", _lines("b2b_gemm_relu.tl")["Compute Relu S and get new S"])]
    assert not s.softmax and not s.normalize and s.exp2_scale is None
    assert (s.d_qk, s.d_v, s.tensor_names, s.variant) == (64, 64, ("A", "B", "C", "O"), "b2b_gemm")


def test_softcap_config_folds_the_scalars_into_one_runtime_slot() -> None:
    cfg = flash_config(_passed("softcap_fwd.tl"), name="softcap_fwd")
    assert [(st.kind, st.fn) for st in cfg.score_ops] == [("map", "x0 * p.score_s0"), ("map", "tanh(x0)"),
                                                         ("mask", "")]
    assert cfg.score_scalars == ("scale * (1.0 / 30.0)",) and not cfg.softcap
    assert float(cfg.exp2_scale) == pytest.approx(30.0 * LOG2E)


def test_score_ops_lowering_table() -> None:
    ops = (TLScoreOp("mul", "2.0"), TLScoreOp("div", "4.0"), TLScoreOp("exp"), TLScoreOp("sub", "bias"),
           TLScoreOp("mask"), TLScoreOp("mask"), TLScoreOp("max", "scale"))
    steps, scalars = lower_score_ops(ops)
    assert [(s.kind, s.fn) for s in steps] == [("map", "x0 * 0.5"), ("map", f"exp2(x0 * {LOG2E!r})"),
                                               ("map", "x0 - p.score_s0"), ("mask", ""),
                                               ("map", "max(x0, p.scale)")]
    assert scalars == ("bias",)
    with pytest.raises(TlcError, match="cannot apply 'sqrt'"):
        lower_score_ops((TLScoreOp("sqrt"),))
    with pytest.raises(TlcError, match="more than 4 runtime scalars"):
        lower_score_ops(tuple(TLScoreOp("add", f"x{i}") for i in range(5)))


def test_mha_through_tl_emits_the_hand_configured_kernel() -> None:
    """The TL path reads masks and the scale from the graph and lands on the same kernel."""
    cfg = flash_config(_passed("mha_fwd.tl", Causal="true", HeadDim="64"), name="flash_fwd")
    hand = FlashFwdConfig(d_qk=64, d_v=64, causal=True, bm=128, bn=64, warps=4, stages=1)
    assert cfg.key() == hand.key()
    tl_src = emit_program(build_flash_fwd_kir(cfg), line_directives=False)
    assert tl_src == emit_program(build_flash_fwd_kir(hand), line_directives=False)


def test_b2b_kir_has_no_softmax_and_maps_relu() -> None:
    cfg = flash_config(_passed("b2b_gemm_relu.tl"), name="b2b_gemm_relu")
    assert not cfg.softmax and cfg.tensor_names == ("A", "B", "C", "O")
    program = build_flash_fwd_kir(cfg)
    ops = list(walk(program))
    for cls in (RowReduceOp, AllReduceOp, Exp2ScaleOp, RowVectorOp, RowBroadcastOp, MaskOp):
        assert not any(isinstance(op, cls) for op in ops), cls.__name__
    relu = [op for op in ops if isinstance(op, MapOp)]
    assert [str(op.fn) for op in relu] == ["max(x0, 0.0)"] and relu[0].loc.line == 47
    assert print_kir(parse_kir(print_kir(program))) == print_kir(program)
    source = emit_program(program, source="b2b_gemm_relu.tl")
    assert "acc_s(i) = max(x0, 0.0f);" in source
    assert '#line 47 "b2b_gemm_relu.tl"' in source
    assert "row_sum" not in source and "exp2f" not in source


def test_softcap_kir_emits_the_computes_in_order() -> None:
    cfg = flash_config(_passed("softcap_fwd.tl", Causal="true"), name="softcap_fwd")
    program = build_flash_fwd_kir(cfg)
    assert print_kir(parse_kir(print_kir(program))) == print_kir(program)
    source = emit_program(program, line_directives=False)
    mul, tanh, mask = (source.index(s) for s in ("acc_s(i) = x0 * p.score_s0;", "acc_s(i) = tanhf(x0);",
                                                 "col > row + diag_"))
    assert mul < tanh < mask
    assert "float score_s0;" in source and "43.28085" in source  # the cap·log2(e) exp2 scale, a constant


def test_launcher_fills_score_scalars_from_inputs() -> None:
    from tlc.backend_cute.attention import spec_of
    from tlc.backend_cute.compile import CompiledKernel
    from tlc.backend_cute.launch import Kernel

    cfg = FlashFwdConfig(d_qk=64, d_v=64, bm=64, bn=32, score_ops=lower_score_ops(
        (TLScoreOp("mul", "scale * bias"), TLScoreOp("mask")))[0], score_scalars=("scale * bias",))
    kern = Kernel(CompiledKernel(build_flash_fwd_kir(cfg), "sm_90", "", b"", {}, 0.0), spec_of(cfg))
    values = kern._score_values(0.5, {"bias": 3.0})
    assert values == {"score_s0": 1.5, "score_s1": 0.0, "score_s2": 0.0, "score_s3": 0.0}
    with pytest.raises(TlcError, match="inputs=.*bias"):
        kern._score_values(0.5, {})


def test_sqrt_on_scores_fails_in_flash_config_with_the_line() -> None:
    text = (SPECS / "b2b_gemm_relu.tl").read_text().replace("Compute Relu S and get new S",
                                                             "Compute Sqrt S and get new S")
    graph, _ = compile_graph(text.encode(), "b2b_sqrt.tl")
    with pytest.raises(TlcError) as exc:
        flash_config(select_attention(graph, "sm_90"), name="b2b_sqrt")
    assert "cannot apply 'sqrt'" in exc.value.render() and "b2b_sqrt.tl:47" in exc.value.render()


def test_tile_operand_on_scores_is_refused() -> None:
    text = (SPECS / "b2b_gemm_relu.tl").read_text().replace("Compute Relu S and get new S",
                                                             "Compute Multiply S, S and get new S")
    graph, _ = compile_graph(text.encode(), "b2b_sq.tl")
    with pytest.raises(TlcError, match="takes a scalar"):
        select_attention(graph, "sm_90")
