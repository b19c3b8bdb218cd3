"""Kernel IR: ops verify, text form round trips (print → parse → print), expressions, builder checks."""
from __future__ import annotations

import pytest

from tlc.diagnostics import Loc, TlcError
from tlc.kir.evaluate import evaluate
from tlc.kir.expr import E, parse_expr
from tests.lowering.programs import attention_kir
from tlc.kir.ops import OP_CLASSES, ForOp, KernelOp, MmaOp, SmemLayoutOp, TiledMmaOp, WaitOp, walk
from tlc.kir.text import parse_kir, print_kir

CONFIGS = {"mha": {}, "causal_br": dict(causal=True, alignment="bottom_right", stages=2),
           "fp16_softcap": dict(dtype="fp16", d=64, bm=64, bn=32, softcap=True),
           "mla": dict(d=192, d_v=128, bm=64, bn=64), "warps2": dict(d=64, bm=64, bn=32, warps=2)}


@pytest.mark.parametrize("cfg", sorted(CONFIGS))
def test_print_parse_print_round_trip(cfg):
    program = attention_kir(**CONFIGS[cfg])
    text = print_kir(program)
    again = parse_kir(text)
    assert print_kir(again) == text  # the text keeps each op's line:col (not the span's end)
    assert [type(op) for op in walk(again)] == [type(op) for op in walk(program)]


def test_every_op_class_is_named_op_and_documented():
    for name, cls in OP_CLASSES.items():
        assert name.endswith("Op") and cls.__doc__, name


def test_builder_program_shape():
    program = attention_kir(stages=2)
    kernel = program.kernels()[0]
    assert isinstance(kernel, KernelOp) and kernel.threads == 128
    ops = list(walk(program))
    mma = next(op for op in ops if isinstance(op, TiledMmaOp))
    assert mma.warps == (4, 1, 1) and mma.tile == (64, 16, 16)
    loop = next(op for op in ops if isinstance(op, ForOp))
    assert loop.stages == 2 and loop.prefetch
    assert any(isinstance(op, WaitOp) and op.pending == 1 for op in walk(loop))
    k_layout = next(op for op in ops if isinstance(op, SmemLayoutOp) and op.name == "sK_layout")
    assert k_layout.shape == (64, 128, 2) and k_layout.swizzle == (3, 3, 3)
    assert sum(isinstance(op, MmaOp) for op in walk(loop)) == 2


@pytest.mark.parametrize("bad, why", [(dict(bm=48), "48 rows on 4 warps"), (dict(bn=8), "rows per pass"),
                                      (dict(stages=3), "1 or 2 stages"), (dict(dtype="fp32"), "dtype"),
                                      (dict(d=100), "multiple of 8"), (dict(alignment="middle", causal=True), "alignment")])
def test_the_lowering_refuses_bad_choices(bad, why):
    with pytest.raises(TlcError, match=why):
        attention_kir(**bad)


@pytest.mark.parametrize("text", [
    "ceil_div(p.sk, 64) - 1", "(a + b) * c", "a - (b - c)", "select(x == -inf, 0.0, x * s)",
    "sK[_, _, n % 2]", "-x", "min(a, max(b, 3))", "a && b || c"])
def test_expression_round_trip(text):
    e = parse_expr(text)
    assert parse_expr(str(e)) == e


def test_expression_evaluation_uses_c_semantics_and_real_ceil_floor():
    env = {"a": -5, "b": 64}
    assert evaluate(E("a / 2"), env) == -2          # C truncation
    assert evaluate(E("floor_div(a, b)"), env) == -1
    assert evaluate(E("ceil_div(a, b)"), env) == 0
    assert evaluate(E("ceil_div(1000, b)"), env) == 16


@pytest.mark.parametrize("text,message", [
    ("NotAnOp(x=1)", "unknown kernel-IR op"),
    ("BarrierOp(nope=1)", "no field"),
    ("WaitOp(pending=`1 +`)", "expected"),
    ("ProgramOp(name=p, body=[]) trailing", "trailing"),
])
def test_parse_errors_are_diagnostics(text, message):
    with pytest.raises(TlcError, match=message):
        parse_kir(text)


def test_verify_catches_bad_ops():
    with pytest.raises(TlcError, match="unknown MMA atom"):
        TiledMmaOp(name="m", atom="SM90_GMMA", warps=(4, 1, 1), tile=(64, 16, 16), thread_slice="t").verify()
    with pytest.raises(TlcError, match="multiple of the atom"):
        SmemLayoutOp(name="L", swizzle=(3, 3, 3), atom=(8, 64), shape=(100, 64)).verify()
    with pytest.raises(TlcError, match="pending"):
        WaitOp(pending=-1).verify()
