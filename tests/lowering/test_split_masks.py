"""`split-masked-trips`: a loop whose masks apply from some trip on runs as a loop without mask code,
then the loop as it was. Structure on both targets (sm_90a by default, sm_90 with SplitMasked=true),
what it leaves alone, the switch, and that the split kernel IR still equals the interpreter while
wrong splits do not (tile evaluation on sm_90: tests/lowering/test_tile_eval.py's `*_split` cases).
GPU: tests/gpu/test_sm90a_specs_gpu.py (odd lengths, causal both alignments)."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.lowering.test_tile_eval import lowered, mismatch
from tlc.api import compile_graph
from tlc.diagnostics import TlcError
from tlc.kir import ops as K
from tlc.kir.expr import BinOp, Const, Var
from tlc.kir.transforms.attention.split_masked_trips import split_masked_trips
from tlc.lowering.passes import run_lowering

SPECS = Path(__file__).resolve().parents[2] / "specs"


def _lower(arch: str, spec: str = "mha_fwd", **defines: str):
    path = SPECS / f"{spec}.tl"
    graph, _ = compile_graph(path.read_bytes(), str(path), defines=defines)
    return run_lowering(graph, arch, name=spec)[0]


def _kv_loops(kernel) -> list[K.ForOp]:
    return [op for op in K.walk(kernel) if isinstance(op, K.ForOp) and op.var == "n"]


def _masks(op) -> list[K.MaskOp]:
    return [x for x in K.walk(op) if isinstance(x, K.MaskOp)]


@pytest.mark.parametrize("arch", ["sm_90", "sm_90a"])
@pytest.mark.parametrize("causal", ["false", "true"])
def test_trips_before_the_first_mask_run_a_loop_without_masks(arch: str, causal: str) -> None:
    state = _lower(arch, Causal=causal, **({"SplitMasked": "true"} if arch == "sm_90" else {}))
    kernel = state.kir.kernels()[0]
    consumer = _kv_loops(kernel)[-2:]   # sm_90a: after the producer's loop
    first, second = consumer
    assert first.stop == Var("n_masked_from") and second.start == Var("n_masked_from")
    assert not _masks(first) and len(_masks(second)) == (2 if causal == "true" else 1)
    (let,) = [op for op in K.walk(kernel) if isinstance(op, K.LetOp) and op.name == "n_masked_from"]
    bounds = "floor_div(p.seqlen_k, 64)"
    assert str(let.value).startswith(f"max({first.start}, min({second.stop}, ") and bounds in str(let.value)
    assert ("floor_div(block_idx * 128 + 1, 64)" in str(let.value)) == (causal == "true")
    # the same body otherwise: the second loop less its guards is the first loop
    plain = tuple(op for op in second.body if not (isinstance(op, K.IfOp) and _masks(op)))
    assert plain == first.body
    assert any(n.startswith("split-masked-trips: loop 'n'") for n in state.schedule)


def _split(state) -> bool:
    return any(isinstance(op, K.LetOp) and op.name == "n_masked_from" for op in K.walk(state.kir))


def test_on_where_warp_specialised_and_the_switch_decides_elsewhere() -> None:
    """The sm_80-family kernels run at the register limit, where a second loop spilled (H200, 2026-11-23):
    one loop unless the program asks; SplitMasked=false keeps one loop on sm_90a too."""
    assert _split(_lower("sm_90a", Causal="true")) and not _split(_lower("sm_90a", Causal="true", SplitMasked="false"))
    state = _lower("sm_90", Causal="true")
    assert not _split(state) and any("not warp-specialised, one loop" in n for n in state.schedule)
    assert _split(_lower("sm_90", Causal="true", SplitMasked="true"))


def test_a_bad_value_is_one_located_error() -> None:
    path = SPECS / "mha_fwd.tl"
    text = path.read_text() + "\nParam SplitMasked = 3"
    graph, _ = compile_graph(text.encode(), str(path))
    with pytest.raises(TlcError, match=re.escape("Param SplitMasked = 3: use true or false")) as exc:
        run_lowering(graph, "sm_90a", name="mha_fwd")
    (diag,) = exc.value.diagnostics
    assert diag.loc is not None and diag.loc.line == len(text.splitlines())


def _kernel_with_loop(body: tuple[K.Op, ...]) -> K.KernelOp:
    kernel = lowered("mha_causal_split")[1].kernels()[0]
    loop = K.ForOp(var="n", start=Const(0), stop=Var("p.seqlen_k"), step=1, body=body)
    return dataclasses.replace(kernel, body=(loop,))


def test_what_it_leaves_alone() -> None:
    mask = next(op for op in K.walk(lowered("mha_causal_split")[1]) if isinstance(op, K.MaskOp))
    guard = K.IfOp(cond=BinOp(">=", Var("n"), Var("p.seqlen_q")), body=(mask,))
    split, _ = split_masked_trips(_kernel_with_loop((guard,)))
    assert [type(op) for op in split.body] == [K.LetOp, K.ForOp, K.ForOp]
    local = K.LetOp(name="edge", type="i32", value=Var("p.seqlen_q"))
    cases = {
        "a threshold read from the loop's own names": (local, dataclasses.replace(guard, cond=BinOp(">=", Var("n"),
                                                                                                     Var("edge")))),
        "a guard that does more than mask": (dataclasses.replace(guard, body=(mask, local)),),
        "a condition of another form": (dataclasses.replace(guard, cond=BinOp("<", Var("n"), Var("p.seqlen_q"))),),
        "a loop that breaks off": (guard, K.IfOp(cond=BinOp(">=", Var("n"), Const(3)), body=(K.BreakOp(),))),
        "a threshold the loop advances": (K.CounterAddOp(counter="edge_count", value=Const(1)),
                                          dataclasses.replace(guard, cond=BinOp(">=", Var("n"), Var("edge_count")))),
    }
    notes_of = {}
    for why, body in cases.items():
        kept, notes_of[why] = split_masked_trips(_kernel_with_loop(body))
        assert [type(op) for op in kept.body] == [K.ForOp], why
    assert notes_of["a loop that breaks off"] == ["split-masked-trips: loop 'n' kept whole (it breaks off)"]


def _resplit(case: str, how: str) -> K.ProgramOp:
    """The lowered program with its split moved or its second loop's guards dropped (a wrong split)."""
    program = lowered(case)[1]
    kernel = program.kernels()[0]

    def fix(ops):
        out = []
        for op in ops:
            if isinstance(op, K.LetOp) and op.name == "n_masked_from" and how == "late":
                op = dataclasses.replace(op, value=BinOp("+", op.value, Const(1)))
            if isinstance(op, K.ForOp) and op.start == Var("n_masked_from") and how == "unguarded":
                op = dataclasses.replace(op, body=tuple(b for b in op.body
                                                        if not (isinstance(b, K.IfOp) and _masks(b))))
            out.append(op)
        return tuple(out)
    return dataclasses.replace(program, body=tuple(dataclasses.replace(k, body=fix(k.body)) if k is kernel else k
                                                   for k in program.body))


@settings(max_examples=12, deadline=None, derandomize=True)
@given(case=st.sampled_from(["mha_causal_split", "mha_causal_br_split", "gqa_split", "softcap_causal_split"]),
       sq=st.integers(1, 150), sk=st.integers(1, 150))
def test_the_split_kernel_ir_equals_the_interpreter(case: str, sq: int, sk: int) -> None:
    assert any(isinstance(op, K.LetOp) and op.name == "n_masked_from" for op in K.walk(lowered(case)[1]))
    assert mismatch(case, sq, sk) == ""


@pytest.mark.parametrize("case, how, sq, sk", [
    ("mha_causal_split", "late", 70, 70),        # a diagonal trip runs without its causal mask
    ("gqa_split", "late", 17, 33),               # the partial last tile runs without its bounds mask
    ("mha_causal_split", "unguarded", 70, 70),   # the masked trips lose their guards
])
def test_a_wrong_split_is_caught(case: str, how: str, sq: int, sk: int) -> None:
    assert mismatch(case, sq, sk, program=_resplit(case, how)) != ""
