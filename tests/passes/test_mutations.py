"""Planted bugs (DESIGN.md §8): each must make a property of the online-softmax / mask
tests fail. Every test first shows the property holds for the real code, then plants the
bug and shows the same property fails — so no test here can pass vacuously.

Properties (tests/passes/softmax_props.py): the pass keeps the interpreter's result, the
result equals the float64 reference, the pass is idempotent.
"""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import tlc.passes.mask as mask_mod
import tlc.passes.online_softmax as online_mod
from softmax_props import apply, keeps_meaning
from tlc.frontend.ast import BinOp
from tlc.ir.interpreter import Interpreter
from tlc.ir.ops import ElementwiseOp, LoopOp
from tlc.passes.mask import MaskPass
from tlc.passes.online_softmax import OnlineSoftmaxPass
from tlc.testing.checks import Shapes
from tlc.testing.strategies import ProgramChoices

ONLINE, MASK = OnlineSoftmaxPass(), MaskPass()
SIZES = [(31, 40), (40, 17), (17, 64), (8, 8)]  # ragged, several KV tiles, both orders, even


def program(**kw) -> str:
    choices = dict(bm=16, bn=8, d_qk=16, d_v=16, kv="head_idx", named_stats=True)
    choices.update(kw)
    return ProgramChoices(**choices).render()


def nothing(graph) -> None:
    pass


def holds(text: str, before, transform, *, scale: float = 0.3, check_layouts: bool = False,
          sizes=SIZES) -> bool:
    for sq, sk in sizes:
        sh = Shapes(1, 2, 2, {"seqlen_q": sq, "seqlen_k": sk}, {"scale": scale})
        if not keeps_meaning(text, before, transform, sh, seed=sq * 100 + sk, check_layouts=check_layouts):
            return False
    return True


def online_holds(text: str, **kw) -> bool:
    return holds(text, nothing, apply(ONLINE), **kw)


def pipeline_holds(text: str, **kw) -> bool:
    return holds(text, apply(ONLINE), apply(MASK), **kw)


# ------------------------------------------------------------------ online-softmax


@pytest.mark.parametrize("named_stats", [True, False])
def test_per_tile_softmax_is_caught(monkeypatch, named_stats: bool) -> None:
    text = program(named_stats=named_stats)
    assert online_holds(text)
    monkeypatch.setattr(online_mod, "_enclosing_loop", lambda region: None)  # every softmax "per tile"
    assert not online_holds(text)


def test_missing_rescale_is_caught(monkeypatch) -> None:
    text = program()
    assert online_holds(text)
    monkeypatch.setattr(online_mod._Rewrite, "rescale_chain", lambda self, *a: None)
    assert not online_holds(text)


def _drop_running_max(graph) -> None:
    """A wrong online form: m_new = max of this tile only (forgets m_old)."""
    for region, op in list(graph.walk()):
        if isinstance(op, LoopOp):
            for inner in op.body.ops():
                if isinstance(inner, ElementwiseOp) and inner.fn == "max" and inner.operands[0] in op.args:
                    op.body.replace(inner, ElementwiseOp(inner.results, (inner.operands[1],) * 2, fn="max",
                                                         loc=inner.loc))


def test_online_form_without_running_max_is_caught() -> None:
    # Large scores: the running max is what keeps exp2 from overflowing.
    text = program()
    assert online_holds(text, scale=60.0)

    def wrong(graph) -> None:
        apply(ONLINE)(graph)
        _drop_running_max(graph)

    assert not holds(text, nothing, wrong, scale=60.0)


# ------------------------------------------------------------------ layouts and transposes


def test_wrong_reshape_target_is_caught() -> None:
    text = program()
    assert online_holds(text, check_layouts=True)
    wrong = text.replace("to (MMA_A, MMA_M, MMA_N)", "to (MMA_B, MMA_M, MMA_N)")
    assert wrong != text
    assert not online_holds(wrong, check_layouts=True)


@pytest.mark.parametrize("d", [16, 8])  # 16: a shape error; 8 = BN: shapes agree, values do not
def test_dropped_transpose_is_caught(d: int) -> None:
    text = program(d_qk=d, d_v=d)
    assert online_holds(text)
    wrong = text.replace("Compute GEMM Q, K.T and get S", "Compute GEMM Q, K and get S")
    assert wrong != text
    assert not online_holds(wrong)


# ------------------------------------------------------------------ loop bounds and masks


def test_floor_division_loop_bound_in_the_interpreter_is_caught(monkeypatch) -> None:
    text = program()
    assert online_holds(text)
    real_eval = Interpreter.eval
    monkeypatch.setattr(Interpreter, "eval", lambda self, e, env, op, ceil=False: real_eval(self, e, env, op))
    assert not online_holds(text)


def test_floor_division_in_the_diagonal_cut_is_caught(monkeypatch) -> None:
    text = program(causal=True, bm=8, bn=16)  # a block of 8 rows needs cdiv(8, 16) = 1 key tile
    assert pipeline_holds(text)
    monkeypatch.setattr(mask_mod, "_cdiv", lambda a, b: BinOp("/", BinOp("-", a, BinOp("%", a, b)), b))
    assert not pipeline_holds(text)


@pytest.mark.parametrize("align", ["bottom_right", "top_left"])
def test_wrong_alignment_in_the_mask_pass_is_caught(monkeypatch, align: str) -> None:
    text = program(causal=True, align=align)
    assert pipeline_holds(text)
    other = "top_left" if align == "bottom_right" else "bottom_right"
    real_shift = mask_mod._shift
    monkeypatch.setattr(mask_mod, "_shift", lambda alignment: real_shift(other))
    assert not pipeline_holds(text)


def test_mask_on_the_wrong_side_is_caught(monkeypatch) -> None:
    """The interpreter's causal mask planted on the other side of the diagonal (j < i + shift)."""
    text = program(causal=True)
    assert pipeline_holds(text)
    real = Interpreter.op_MaskOp

    def wrong_side(self, op, args, vals, env):
        x = args[0]
        if op.kind != "causal":
            return real(self, op, args, vals, env)
        shift = 0 if op.alignment == "top_left" else int(env["seqlen_k"]) - int(env["seqlen_q"])
        below = x.cols[None, :] < x.rows[:, None] + shift
        return dataclasses.replace(x, data=torch.where(below, torch.full_like(x.data, -math.inf), x.data))

    monkeypatch.setattr(Interpreter, "op_MaskOp", wrong_side)
    assert not pipeline_holds(text)


def test_mask_from_the_wrong_trip_is_caught(monkeypatch) -> None:
    """Masking only from one tile too late leaves scores above the diagonal unmasked."""
    text = program(causal=True)
    assert pipeline_holds(text)
    real_causal = mask_mod._LoopMasks.causal

    def late(self, mask, rows, cols):
        real_causal(self, mask, rows, cols)
        for op in self.body.ops():
            if getattr(op, "kind", None) == "causal" and op.from_iteration:
                (var, e), = op.from_iteration
                self.body.replace(op, op.__class__(op.results, op.operands, kind=op.kind, alignment=op.alignment,
                                                   from_iteration=((var, BinOp("+", e, mask_mod.Const(1))),),
                                                   loc=op.loc))

    monkeypatch.setattr(mask_mod._LoopMasks, "causal", late)
    assert not pipeline_holds(text)
