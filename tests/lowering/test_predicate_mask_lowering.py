"""Predicate masks lowered for both targets: the kernel IR's MaskOp carries the predicate over `q_idx` and
`kv_idx` (bound per element from its row and column) and the kernel's scalars; on sm_90 the tile evaluator
runs the kernel IR equal to the TL interpreter at odd sizes (planted bugs in the predicate are caught);
the emitted CuTe masks each element of the partial trips the mask pass classified (the loop starts and
stops at the key tiles the window may reach), on sm_90a in each trip form the schedule makes (the peeled
first trip, the trips before and from the first partial tile), and the sm_90a protocol checker accepts the
kernel; the kernel-IR text and the cache codec round-trip it. Not run on a GPU."""
from __future__ import annotations

import dataclasses
import json
import math
from functools import lru_cache
from pathlib import Path

import pytest
import torch

from tlc.api import compile_graph
from tlc.backend_cute.kir_codec import decode, encode
from tlc.ir.interpreter import run_program
from tlc.kir import ops as K
from tlc.kir.expr import E
from tlc.kir.sm90_protocol import protocol_problems
from tlc.kir.text import parse_kir, print_kir
from tlc.kir.tile_eval import evaluate_program
from tlc.lowering.emit_text import emit_text
from tlc.lowering.passes import run_lowering

ROOT = Path(__file__).resolve().parents[2]
SPECS = ROOT / "specs"
MHA = (SPECS / "mha_fwd.tl").read_text()
GQA = (SPECS / "gqa_fwd.tl").read_text()   # its query tiles are counted from the end
WINDOW = (SPECS / "sliding_window_fwd.tl").read_text()
SMALL = {"HeadDim": "32", "BM": "64", "BN": "32"}
TOL = 1e-2   # bf16 P and O in the kernel against the float64 interpreter (tests/lowering/test_tile_eval.py)


def with_mask(text: str, masks: str) -> str:
    """`text` (mha_fwd.tl or gqa_fwd.tl) with `masks` before its softmax."""
    return text.replace("  Compute Softmax S", masks + "  Compute Softmax S")


CASES = {  # name → (TL text, defines, (query heads, KV heads))
    "window": (WINDOW, {**SMALL, "Window": "40"}, (2, 2)),
    "window_gqa": (WINDOW, {**SMALL, "Window": "7"}, (4, 2)),
    "prefix_lm": (with_mask(MHA, "  Compute Mask S where kv_idx >= 37 && kv_idx > q_idx and get new S\n"),
                  SMALL, (2, 2)),
    # integer / and % of a position (floor_div, floor_mod of negative operands), head and batch indices
    "blocks_heads": (with_mask(MHA, "  Compute Mask S where q_idx / 24 != kv_idx / 24 || (kv_idx - q_idx) % 5 == 1 "
                                    "|| head_idx == 1 && batch_idx == 1 && kv_idx > 3 and get new S\n"),
                     SMALL, (2, 2)),
    # beside a bottom-right causal mask (the loop cut at the diagonal), query tiles counted from the end
    "window_causal_br_from_end": (with_mask(GQA, "  Compute Mask S where kv_idx < q_idx - 50 and get new S\n"),
                                  {**SMALL, "Causal": "true", "Align": "bottom_right"}, (4, 2)),
    "guarded_off": (with_mask(MHA, "  Compute Mask S where kv_idx > 0 and get new S when Causal\n"), SMALL, (2, 2)),
}
SIZES = [(1, 1), (17, 33), (63, 65), (65, 63), (70, 9), (130, 97)]


@lru_cache(maxsize=None)
def lowered(case: str, arch: str = "sm_90"):
    text, defines, _ = CASES[case]
    graph, _ = compile_graph(text, f"{case}.tl", defines=defines)
    state, _ = run_lowering(graph, arch, name=case)
    return graph, state.kir, state.abi


def mismatch(case: str, sq: int, sk: int, batch: int = 2, program: K.ProgramOp | None = None) -> str:
    """'' when the kernel IR on the tile evaluator equals the interpreter (written elements included)."""
    graph, kir, abi = lowered(case)
    heads, kv_heads = CASES[case][2]
    gen = torch.Generator().manual_seed(sq * 1000 + sk)
    rows = {"seqlen_q": sq, "seqlen_k": sk}
    tensors = {a.name: torch.randn(batch, heads if a.head == "head_idx" else kv_heads, rows[a.rows], a.cols,
                                   generator=gen).to(torch.bfloat16).double() for a in abi.tensors if not a.output}
    scalars = {**rows, "scale": 1.0 / math.sqrt(abi.tensors[0].cols)}
    given = dict(tensors, O=torch.full((batch, heads, sq, abi.tensors[-1].cols), float("nan"), dtype=torch.float64))
    want = run_program(graph, given, scalars)["O"]
    got = evaluate_program(program or kir, abi, tensors, scalars)["O"]
    if (torch.isnan(got) != torch.isnan(want)).any():
        return f"{int(torch.isnan(got).sum())} NaN elements, the interpreter {int(torch.isnan(want).sum())}"
    err = (got - want).nan_to_num(0.0).abs().max().item() if want.numel() else 0.0
    bound = TOL * max(1.0, want.nan_to_num(0.0).abs().max().item())
    return "" if err <= bound else f"max |kernel IR - interpreter| = {err:.3e} > {bound:.3e}"


@pytest.mark.parametrize("sq, sk", SIZES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_kernel_ir_equals_interpreter_on_sm90(case: str, sq: int, sk: int) -> None:
    assert mismatch(case, sq, sk) == ""


def predicate_masks(program: K.Op) -> list[K.MaskOp]:
    return [x for x in K.walk(program) if isinstance(x, K.MaskOp) and x.predicate is not None]


def replace_predicate(program: K.ProgramOp, predicate: str) -> K.ProgramOp:
    def walk(op: K.Op) -> K.Op:
        regions = {r: tuple(walk(c) for c in getattr(op, r)) for r in op.regions}
        op = dataclasses.replace(op, **regions) if regions else op
        if isinstance(op, K.MaskOp) and op.predicate is not None:
            return dataclasses.replace(op, predicate=E(predicate))
        return op
    return walk(program)  # type: ignore[return-value]


@pytest.mark.parametrize("planted", ["q_idx > kv_idx || q_idx < kv_idx - 40",   # rows and columns swapped
                                     "kv_idx > q_idx || kv_idx < q_idx - 39",    # a window one key shorter
                                     "kv_idx > q_idx"])                          # the window's start dropped
def test_a_wrong_predicate_in_the_kernel_ir_is_caught(planted: str) -> None:
    (mask,) = predicate_masks(lowered("window")[1])
    assert str(mask.predicate) == "kv_idx > q_idx || kv_idx < q_idx - 40"
    bad = replace_predicate(lowered("window")[1], planted)
    assert any(mismatch("window", sq, sk, program=bad) for sq, sk in SIZES)


def test_the_kernel_ir_mask_reads_the_kernels_scalars() -> None:
    (mask,) = predicate_masks(lowered("blocks_heads")[1])
    assert str(mask.predicate) == ("floor_div(q_idx, 24) != floor_div(kv_idx, 24) || floor_mod(kv_idx - q_idx, 5) == 1 "
                                   "|| head_idx == 1 && batch_idx == 1 && kv_idx > 3")
    assert (mask.causal, mask.bounds) == (False, False)
    assert mask.used_names() >= {"block_idx", "n"} and not mask.used_names() & {"q_idx", "kv_idx"}
    assert lowered("guarded_off")[1] and predicate_masks(lowered("guarded_off")[1]) == []


@pytest.mark.parametrize("arch", ["sm_90", "sm_90a"])
def test_kernel_ir_text_and_cache_codec_round_trip(arch: str) -> None:
    _, kir, _ = lowered("window", arch)
    text = print_kir(kir)
    assert print_kir(parse_kir(text)) == text
    assert print_kir(decode(json.loads(json.dumps(encode({"p": kir}))))["p"]) == text
    assert "predicate=`kv_idx > q_idx || kv_idx < q_idx - 40`" in text
    assert "predicate=none" not in text   # a causal or bounds mask's text is as before


def test_sm90a_masks_every_trip_form_and_passes_the_protocol_checker() -> None:
    _, kir, _ = lowered("window", "sm_90a")
    assert len(predicate_masks(kir)) == 3   # the peeled first trip, the trips before the partial tile, the rest
    assert protocol_problems(kir) == []


def emitted(case: str, arch: str) -> str:
    text, defines, _ = CASES[case]
    return emit_text(text.encode(), f"{case}.tl", arch, defines, "cute", line_directives=False)


@pytest.mark.parametrize("arch, count", [("sm_90", 1), ("sm_90a", 3)])
def test_emitted_cute_masks_each_element(arch: str, count: int) -> None:
    source = emitted("window", arch)
    golden = ["const int row0_ = block_idx * 64, col0_ = ",   # n * 32, or 0 * 32 in the peeled first trip
              "for (int i = 0; i < size(acc_S); ++i) {",
              "const int q_idx = row0_ + get<0>(tSc64x32(i));",
              "const int kv_idx = col0_ + get<1>(tSc64x32(i));",
              "if (kv_idx > q_idx || kv_idx < q_idx - 40) { acc_S(i) = -INFINITY; }"]
    lines = [line.strip() for line in source.splitlines()]
    at = [i for i, line in enumerate(lines) if line == golden[-1]]
    assert len(at) == count, source
    for i in at:
        assert lines[i - 3:i + 1] == golden[1:] and lines[i - 5].startswith(golden[0])
    if arch == "sm_90":   # the window's key tiles only, and the mask only in its partial trips
        assert ("for (int n = tlc::max(0, tlc::floor_div(tlc::max(block_idx * 64 - 40, 0), 32)); n < tlc::min("
                "tlc::ceil_div(p.seqlen_k, 32), tlc::floor_div(tlc::max(tlc::min((block_idx + 1) * 64, p.seqlen_q) "
                "- 1, -1), 32) + 1); ++n) {") in lines
        assert ("if (n >= tlc::floor_div(tlc::max(block_idx * 64, -1) + 1 - 32, 32) + 1 || n < tlc::ceil_div("
                "tlc::max(tlc::min((block_idx + 1) * 64, p.seqlen_q) - 1 - 40, 0), 32)) {") in lines


def test_emitted_cute_divides_as_the_language_does() -> None:
    source = emitted("blocks_heads", "sm_90")
    assert ("if (tlc::floor_div(q_idx, 24) != tlc::floor_div(kv_idx, 24) || tlc::floor_mod(kv_idx - q_idx, 5) == 1 "
            "|| head_idx == 1 && batch_idx == 1 && kv_idx > 3) { acc_S(i) = -INFINITY; }") in source


def test_an_unused_position_is_marked_used() -> None:
    source = emitted("prefix_lm", "sm_90")
    assert "if (kv_idx >= 37 && kv_idx > q_idx) { acc_S(i) = -INFINITY; }" in source
    text = with_mask(MHA, "  Compute Mask S where kv_idx >= 5 and get new S\n")
    only_cols = emit_text(text.encode(), "cols.tl", "sm_90", SMALL, "cute", line_directives=False)
    assert "(void)q_idx;" in only_cols and "(void)kv_idx;" not in only_cols
