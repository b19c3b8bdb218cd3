"""The TL passes keep what a program with predicate masks means: attention programs with a predicate mask
(windows, prefixes, blocks, strides, per head and batch, with or without a causal mask beside it, the query
tile counted from the end, a loop starting late, GQA) are interpreted as written and after the default
pipeline, at odd sizes (1, 17, a tile ± 1, several tiles) on NaN-poisoned outputs, and must be equal to
1e-9 relative, including which output elements are written. The mask pass classifies key tiles by the keys
a predicate leaves each row (tlc/expr/key_window.py): a predicate with a key window gets the trips it
applies in and a cut loop, and planted misclassifications (a full tile one trip early, an empty one cut
one trip late) are caught by the comparison."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tlc.api import lower_source
from tlc.ir.interpreter import InterpError, run_program
from tlc.expr import parse_expr
from tlc.ir.ops import LoopOp, MaskOp
from tlc.expr.key_window import key_window
from tlc.passes.pipeline import DEFAULT_PIPELINE, run_pipeline
from tlc.testing.checks import Shapes, make_inputs
from tlc.testing.structural import output_difference

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[2]
MHA = (ROOT / "specs" / "mha_fwd.tl").read_text()
RTOL = 1e-9
PREDICATES = [   # templates over {a} (a small count) and {b} (a positive divisor)
    "kv_idx > q_idx || kv_idx < q_idx - {a}",              # a causal sliding window
    "kv_idx >= {a} && kv_idx > q_idx",                     # prefix-LM
    "q_idx / {b} != kv_idx / {b}",                         # block diagonal: integer / floors
    "(kv_idx - q_idx) % {b} == 1",                         # a stride: % floors, of negative operands too
    "kv_idx > q_idx + head_idx - {a} || batch_idx == 1 && kv_idx == 0",
    "q_idx >= {a}",                                        # whole rows masked: their output is 0
    "kv_idx * scale > {a}.5 || min(q_idx, kv_idx) == {a}",
    "kv_idx < seqlen_k - {a} && q_idx < seqlen_q - 1",
    "kv_idx >= q_idx + {a} || q_idx - {b} > kv_idx",       # a window through >= and a flipped comparison
    "kv_idx < max(q_idx - {a}, {b}) || kv_idx > min(q_idx + {a}, seqlen_k - {b})",   # bidirectional, clamped
    "kv_idx > q_idx || q_idx == {a}",                      # a window with a term it cannot read: not exact
    "kv_idx < q_idx - {a}",                                # only a lower bound: masked in early trips only
]


@dataclass(frozen=True)
class Choice:
    predicate: str
    causal: str            # "", "top_left" or "bottom_right": a causal mask beside the predicate
    causal_first: bool     # the causal mask before the predicate mask
    before_scale: bool     # the predicate mask before `Compute Multiply S, scale`
    from_end: bool         # the query tile counted from the end (its store too)
    late_start: bool       # the loop starts a tile before the query tile's diagonal
    gqa: bool
    bm: int
    bn: int
    d: int

    def render(self) -> str:
        text = MHA.replace("Param Variant = attention\n", "")
        lines = [f"Compute Mask S where {self.predicate} and get new S"]
        if self.causal:
            causal = f"Compute Mask S causal {self.causal} and get new S"
            lines = [causal, *lines] if self.causal_first else [*lines, causal]
        masks = "\n  ".join(lines)
        text = text.replace("  Compute Mask S causal Align and get new S when Causal\n", "")
        scale = "  Compute Multiply S, scale and get new S\n"
        text = text.replace(scale, f"  {masks}\n{scale}" if self.before_scale else f"{scale}  {masks}\n")
        if self.from_end:
            text = text.replace("[L = block_idx]", "[L = block_idx from end]")
        if self.late_start:
            text = text.replace("for n = 0:seqlen_k / BN", "for n = max(0, block_idx * BM / BN - 1):seqlen_k / BN")
        if not self.gqa:
            text = text.replace("with offset head_idx / group", "with offset head_idx")
        return text

    def defines(self) -> dict[str, str]:
        return {"HeadDim": str(self.d), "BM": str(self.bm), "BN": str(self.bn)}


@st.composite
def choices(draw) -> Choice:
    template = draw(st.sampled_from(PREDICATES))
    predicate = template.format(a=draw(st.integers(0, 6)), b=draw(st.integers(1, 5)))
    return Choice(predicate, draw(st.sampled_from(["", "top_left", "bottom_right"])), draw(st.booleans()),
                  draw(st.booleans()), draw(st.booleans()), draw(st.booleans()), draw(st.booleans()),
                  draw(st.sampled_from([1, 3, 4, 5])), draw(st.sampled_from([1, 3, 4, 5])),
                  draw(st.sampled_from([2, 3, 4])))


def odd_sizes(c: Choice) -> list[tuple[int, int]]:
    return [(1, 1), (17, 17), (c.bm + 1, max(1, c.bn - 1)), (max(1, c.bm - 1), c.bn + 1),
            (3 * c.bm + 1, 4 * c.bn + 1)]


def check(c: Choice, seed: int) -> None:
    text = c.render()
    written = lower_source(text, "pm.tl", defines=c.defines())
    built = lower_source(text, "pm.tl", defines=c.defines())
    run_pipeline(built, DEFAULT_PIPELINE)
    window = key_window(parse_expr(c.predicate))
    for mask in (op for _, op in built.walk() if isinstance(op, MaskOp) and op.kind == "predicate"):
        placed = window is not None and window.exact
        assert (mask.trips() is not None) == placed, text   # placed only by a key window it reads whole
    if not c.causal and window is None:
        (loop,) = [op for _, op in built.walk() if isinstance(op, LoopOp)]
        assert "seqlen_k / BN" == str(loop.stop), text   # no loop cut without a causal mask or a key window
    heads, kv_heads = (2, 1) if c.gqa else (2, 2)
    for sq, sk in odd_sizes(c):
        shapes = Shapes(batch=2, heads=heads, kv_heads=kv_heads, ints={"seqlen_q": sq, "seqlen_k": sk},
                        floats={"scale": 0.7})
        tensors, _, scalars = make_inputs(written, shapes, seed)
        try:
            want = run_program(written, tensors, scalars)["O"]
        except InterpError:   # a loop without trips as written has no softmax statistics: no meaning
            continue
        got = run_program(built, tensors, scalars, check_layouts=True)["O"]
        why, err = output_difference(got, want)
        assert not why and err <= RTOL, f"at {sq}x{sk}: {why or f'max relative error {err:.3e}'}\n{text}"


@settings(max_examples=60, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(c=choices(), seed=st.integers(0, 1 << 16))
def test_the_passes_keep_the_meaning_of_predicate_masks(c: Choice, seed: int) -> None:
    check(c, seed)


def test_every_template_with_a_causal_mask_beside_it() -> None:
    """Each predicate once with a bottom-right causal mask (the loop is cut at the diagonal) and GQA."""
    for i, template in enumerate(PREDICATES):
        check(Choice(template.format(a=3, b=2), "bottom_right", i % 2 == 0, i % 3 == 0, i % 2 == 1, False, True,
                     4, 3, 3), i)


def test_the_check_fails_when_a_pass_drops_a_predicate_mask(monkeypatch) -> None:
    """A planted bug (the mask pass replaces the predicate by a bounds mask) makes the comparison fail."""
    import pytest

    import tlc.passes.mask as mask_mod

    original = mask_mod._LoopMasks.run

    def run(self) -> None:
        original(self)
        for op in list(self.body.ops()):
            if isinstance(op, MaskOp) and op.kind == "predicate":
                self.body.replace_all_uses(op.result, op.operands[0])
                self.body.erase(op)

    monkeypatch.setattr(mask_mod._LoopMasks, "run", run)
    with pytest.raises(AssertionError, match="max relative error|written"):
        check(Choice("kv_idx > q_idx || kv_idx < q_idx - 2", "", False, False, False, False, False, 4, 4, 3), 0)


def _misplace(monkeypatch, shift) -> None:
    """Plant a misclassification: after the mask pass, `shift(mask, loop)` rewrites the placed masks."""
    import dataclasses

    import tlc.passes.mask as mask_mod

    original = mask_mod._LoopMasks.run

    def run(self) -> None:
        original(self)
        shift(self)

    monkeypatch.setattr(mask_mod._LoopMasks, "run", run)


def test_the_check_fails_when_a_partial_trip_is_taken_for_full(monkeypatch) -> None:
    import dataclasses

    import pytest
    from tlc.expr import BinOp, Const

    def shift(loops) -> None:
        for op in list(loops.body.ops()):
            if isinstance(op, MaskOp) and op.kind == "predicate" and op.from_iteration:
                (var, e), = op.from_iteration
                loops.body.replace(op, dataclasses.replace(op, from_iteration=((var, BinOp("+", e, Const(1))),)))

    _misplace(monkeypatch, shift)
    with pytest.raises(AssertionError, match="max relative error|written"):
        check(Choice("kv_idx > q_idx || kv_idx < q_idx - 2", "", False, False, False, False, False, 4, 4, 3), 0)


def test_the_check_fails_when_a_trip_with_visible_keys_is_cut(monkeypatch) -> None:
    import dataclasses

    import pytest
    from tlc.expr import BinOp, Call, Const

    def shift(loops) -> None:
        loop = loops.loop
        assert loop.start is not None and str(loop.start).startswith("max(")
        moved = dataclasses.replace(loop, start=BinOp("+", loop.start, Const(1)))
        loops.region.replace(loop, moved)
        loops.loop = moved

    _misplace(monkeypatch, shift)
    with pytest.raises(AssertionError, match="max relative error|written"):
        check(Choice("kv_idx > q_idx || kv_idx < q_idx - 2", "", False, False, False, False, False, 4, 4, 3), 0)
