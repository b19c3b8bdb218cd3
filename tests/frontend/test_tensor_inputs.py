"""Tensor Inputs (`Input kv_lengths : int32[batch]`, tlc/ir/tensor_inputs.py) read by element in loop bounds and
mask predicates: the declaration, the refusals at their place, the text forms (fmt, the TL-graph text), the
interpreter's meaning (an index outside its dimension reads 0), the mask pass's key bound read from one, the
kernel IR on the sm_90 tile evaluator equal to the interpreter (specs/document_mask_fwd.tl, planted bugs
caught), the emitted CuTe, the sm_90a protocol check, and the launcher binding a tensor to its pointer field
(on the CPU, the GPU stood in for). Not run on a GPU."""
from __future__ import annotations

import ctypes
import dataclasses
import math
from functools import lru_cache
from pathlib import Path

import pytest
import torch

from tlc.api import compile_graph
from tlc.diagnostics import TlcError
from tlc.frontend.format import format_program
from tlc.frontend.lower import lower_program
from tlc.frontend.parser import parse_text
from tlc.ir.interpreter import InterpError, run_program
from tlc.ir.irparser import parse_ir
from tlc.ir.ops import LoopOp
from tlc.ir.printer import print_graph
from tlc.kir import ops as K
from tlc.kir.expr import E
from tlc.kir.sm90_protocol import protocol_problems
from tlc.kir.tile_eval import evaluate_program
from tlc.lowering.emit_text import emit_text
from tlc.lowering.passes import run_lowering

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "specs" / "document_mask_fwd.tl"
MHA = (ROOT / "specs" / "mha_fwd.tl").read_text()
SMALL = {"HeadDim": "32", "BM": "64", "BN": "32"}


def errors(text: str) -> list[str]:
    try:
        lower_program(parse_text(text, "t.tl"))
    except TlcError as exc:
        return [f"{d.loc.file}:{d.loc.line}:{d.loc.col}: {d.message}" for d in exc.diagnostics
                if d.severity == "error" and d.loc is not None]
    return []


def with_lines(inputs: str = "", loop: str | None = None, mask: str | None = None) -> str:
    text = MHA.replace("Input scale : float\n", "Input scale : float\n" + inputs)
    if loop is not None:
        text = text.replace("for n = 0:seqlen_k / BN", loop)
    if mask is not None:
        text = text.replace("  Compute Softmax S", f"  Compute Mask S where {mask} and get new S\n  Compute Softmax S")
    return text


# ------------------------------------------------------------------ the language


def test_a_tensor_input_is_declared_with_its_element_type_and_dimensions() -> None:
    graph = lower_program(parse_text(SPEC.read_text(), "d.tl"))
    assert {n: t.text() for n, t in graph.tensor_inputs.items()} == {
        "doc_q": "int32[batch, seqlen_q]", "doc_k": "int32[batch, seqlen_k]", "kv_lengths": "int32[batch]"}
    assert "kv_lengths" not in graph.inputs   # the scalar Inputs stay scalars


@pytest.mark.parametrize("text, where, message", [
    (with_lines("Input x : int64[batch]\n"), "22:1", "a tensor Input's element type must be int32 or fp32, not 'int64'"),
    (with_lines("Input x : int32\n"), "22:1", "input type must be int or float, not 'int32' (a tensor: 'int32[…]'"),
    (with_lines("Input x : int32[batch, rows]\n"), "22:1", "'rows' cannot size a tensor Input"),
    (with_lines("Input batch : int32[4]\n"), "22:1", "'batch' is the batch size in a tensor Input's dimensions"),
    (with_lines("Input x : int32[batch]\n", mask="x[batch_idx, 0] > kv_idx"), "43:24",
     "'x[batch_idx, 0]' gives 2 index(es), but 'x' is int32[batch]"),
    (with_lines("Input x : int32[batch]\n", mask="x > kv_idx"), "43:24", "'x' is a tensor Input (int32[batch])"),
    (with_lines(mask="y[batch_idx] > kv_idx"), "42:24", "indexes 'y', which is not declared"),
    (with_lines(loop="for n = 0:Q[0]"), "35:1", "indexes 'Q', which is a tile"),
    (with_lines("Input x : int32[batch]\n").replace("[L = block_idx]", "[L = x[batch_idx]]", 1), "34:41",
     "reads an element of a tensor Input ('Input x : int32[…]') only in a loop bound, a mask predicate or a global"),
])
def test_what_a_tensor_input_cannot_be_is_refused_at_its_place(text: str, where: str, message: str) -> None:
    found = errors(text)
    assert any(f"t.tl:{where}:" in e and message in e for e in found), found


def test_fmt_and_the_graph_text_keep_a_tensor_input() -> None:
    text = SPEC.read_text()
    assert "Input doc_q : int32[batch, seqlen_q]" in format_program(parse_text(text, "d.tl"))
    graph, _ = compile_graph(text, "d.tl", defines=SMALL)
    printed = print_graph(graph)
    assert "input kv_lengths : int32 [`batch`]" in printed and "kv_lengths[batch_idx]" in printed
    assert print_graph(parse_ir(printed)) == printed


# ------------------------------------------------------------------ meaning


def test_an_index_outside_its_dimension_reads_0_and_a_wrong_shape_is_refused() -> None:
    text = with_lines("Input x : int32[batch]\n", loop="for n = 0:cdiv(min(x[batch_idx + 1], seqlen_k), BN)")
    graph = lower_program(parse_text(text, "t.tl"), SMALL)
    q = torch.randn(2, 1, 40, 32, dtype=torch.float64)
    tensors = {"Q": q, "K": q.clone(), "V": q.clone(), "O": torch.full_like(q, float("nan"))}
    out = run_program(graph, tensors, {"seqlen_q": 40, "seqlen_k": 40, "scale": 0.2,
                                       "x": torch.tensor([40, 7], dtype=torch.int32)})["O"]
    assert (out[1] == 0).all()                  # batch 1 reads x[2], outside: 0 keys, so a row sees none
    assert not torch.isnan(out[0]).any()        # batch 0 reads x[1] = 7 keys
    with pytest.raises(InterpError, match=r"'x' is int32\[batch\] = \[2\], but the tensor given has shape \[3\]"):
        run_program(graph, tensors, {"seqlen_q": 40, "seqlen_k": 40, "scale": 0.2,
                                     "x": torch.zeros(3, dtype=torch.int32)})


def test_the_mask_pass_stops_the_loop_at_the_key_length_read_from_a_tensor() -> None:
    graph, _ = compile_graph(SPEC.read_text(), "d.tl", defines=SMALL)
    (loop,) = [op for _, op in graph.walk() if isinstance(op, LoopOp)]
    assert str(loop.stop) == "min(seqlen_k / BN, floor_div(max(kv_lengths[batch_idx] - 1, -1), BN) + 1)"


# ------------------------------------------------------------------ the kernel IR and the emitted CuTe


@lru_cache(maxsize=None)
def lowered(arch: str, causal: str = "false", align: str = "top_left"):
    graph, _ = compile_graph(SPEC.read_text(), "d.tl", defines=dict(SMALL, Causal=causal, Align=align))
    state, _ = run_lowering(graph, arch, name="doc")
    return graph, state.kir, state.abi


def inputs(b: int, h: int, kvh: int, sq: int, sk: int, seed: int) -> tuple[dict, dict]:
    g = torch.Generator().manual_seed(seed)
    t = {n: torch.randn(b, h if n == "Q" else kvh, sq if n == "Q" else sk, 32, generator=g).to(torch.bfloat16).double()
         for n in "QKV"}
    runtime = {"seqlen_q": sq, "seqlen_k": sk, "scale": 1 / math.sqrt(32),
               "doc_q": torch.sort(torch.randint(0, 3, (b, sq), generator=g, dtype=torch.int32), dim=1).values,
               "doc_k": torch.sort(torch.randint(0, 3, (b, sk), generator=g, dtype=torch.int32), dim=1).values,
               "kv_lengths": torch.tensor([0, sk + 5, sk // 2 + 1][:b], dtype=torch.int32)}
    return t, runtime


def mismatch(arch_case: tuple[str, str], sq: int, sk: int, program: K.ProgramOp | None = None) -> str:
    graph, kir, abi = lowered("sm_90", *arch_case)
    t, runtime = inputs(3, 4, 2, sq, sk, sq * 131 + sk)
    given = dict(t, O=torch.full((3, 4, sq, 32), float("nan"), dtype=torch.float64))
    want = run_program(graph, given, runtime)["O"]
    got = evaluate_program(program or kir, abi, t, runtime)["O"]
    if (torch.isnan(got) != torch.isnan(want)).any():
        return f"{int(torch.isnan(got).sum())} NaN elements, the interpreter {int(torch.isnan(want).sum())}"
    err = (got - want).nan_to_num(0.0).abs().max().item()
    return "" if err <= 1e-2 * max(1.0, want.nan_to_num(0.0).abs().max().item()) else f"max error {err:.3e}"


@pytest.mark.parametrize("sq, sk", [(1, 1), (17, 33), (65, 63), (70, 9), (130, 97)])
@pytest.mark.parametrize("case", [("false", "top_left"), ("true", "bottom_right")])
def test_kernel_ir_equals_interpreter_on_sm90(case, sq: int, sk: int) -> None:
    assert mismatch(case, sq, sk) == ""


def _planted(program: K.ProgramOp, old: str, new: str) -> K.ProgramOp:
    def walk(op: K.Op) -> K.Op:
        regions = {r: tuple(walk(c) for c in getattr(op, r)) for r in op.regions}
        op = dataclasses.replace(op, **regions) if regions else op
        if isinstance(op, K.MaskOp) and op.predicate is not None and old in str(op.predicate):
            return dataclasses.replace(op, predicate=E(str(op.predicate).replace(old, new)))
        return op
    return walk(program)  # type: ignore[return-value]


@pytest.mark.parametrize("old, new", [("p.doc_k_ptr", "p.doc_q_ptr"),          # the other tensor
                                      ("batch_idx * p.seqlen_k", "batch_idx * p.seqlen_q")])   # a wrong row
def test_a_planted_wrong_load_is_caught(old: str, new: str) -> None:
    from tlc.kir.tile_eval_state import TileEvalError

    _, kir, _ = lowered("sm_90")
    try:
        found = mismatch(("false", "top_left"), 17, 33, _planted(kir, old, new))
    except TileEvalError as exc:   # a read past the tensor's end is a fault of its own
        found = exc.diagnostics[0].message
    assert found != ""


def test_emitted_cute_reads_each_element_through_its_pointer_guarded() -> None:
    source = emit_text(SPEC.read_bytes(), "d.tl", "sm_90", SMALL, "cute", line_directives=False)
    lines = [line.strip() for line in source.splitlines()]
    assert {"int* doc_q_ptr;", "int* doc_k_ptr;", "int* kv_lengths_ptr;"} <= set(lines)
    assert ("if (kv_idx >= ((batch_idx >= 0 && batch_idx < p.batch) ? p.kv_lengths_ptr[batch_idx] : 0) || "
            "((batch_idx >= 0 && batch_idx < p.batch && (q_idx >= 0 && q_idx < p.seqlen_q)) ? "
            "p.doc_q_ptr[batch_idx * p.seqlen_q + q_idx] : 0) != ((batch_idx >= 0 && batch_idx < p.batch && "
            "(kv_idx >= 0 && kv_idx < p.seqlen_k)) ? p.doc_k_ptr[batch_idx * p.seqlen_k + kv_idx] : 0)) "
            "{ acc_S(i) = -INFINITY; }") in lines


def test_sm90a_builds_it_and_its_protocol_holds_for_any_loaded_length() -> None:
    """The checker runs each size with every element 0, 1 and the longer length: no trip, one, many."""
    _, kir, abi = lowered("sm_90a", "true", "bottom_right")
    assert protocol_problems(kir) == []
    assert [n for n, _, _ in abi.tensor_inputs] == ["doc_q", "doc_k", "kv_lengths"]


# ------------------------------------------------------------------ the launcher


def test_the_launcher_binds_each_tensor_to_its_pointer_and_refuses_a_wrong_one(monkeypatch) -> None:
    from bench.launch_stand_ins import no_gpu, qkv, record, stand_in_kernel

    no_gpu(monkeypatch.setattr)
    _, kir, abi = lowered("sm_90a")
    kernel = stand_in_kernel(kir, abi)
    driver = record(monkeypatch.setattr, ctypes.sizeof(kernel._struct))
    q, k, v = qkv(2, 4, 2, 40, 50, False, d=32)
    runtime = {"doc_q": torch.zeros(2, 40, dtype=torch.int32), "doc_k": torch.zeros(2, 50, dtype=torch.int32),
               "kv_lengths": torch.tensor([50, 3], dtype=torch.int32)}
    kernel(q, k, v, **runtime)
    struct = kernel._struct.from_buffer_copy(driver.launches[-1][-1])
    for name, t in runtime.items():
        assert getattr(struct, f"{name}_ptr") == t.data_ptr()
    with pytest.raises(TlcError, match=r"needs the tensor Input 'kv_lengths' \(int32\[batch\]\): pass kv_lengths="):
        kernel(q, k, v, doc_q=runtime["doc_q"], doc_k=runtime["doc_k"])
    with pytest.raises(TlcError, match=r"'kv_lengths' is int32\[batch\]: pass a torch.int32 tensor, not torch.int64"):
        kernel(q, k, v, **dict(runtime, kv_lengths=runtime["kv_lengths"].long()))
    with pytest.raises(TlcError, match=r"'doc_k' is int32\[batch, seqlen_k\] = \[2, 50\] for this call, got "
                                       r"shape \[2, 40\]"):
        kernel(q, k, v, **dict(runtime, doc_k=runtime["doc_q"]))


@pytest.mark.parametrize("arch", ["sm_90", "sm_90a"])
def test_kernel_ir_text_cache_codec_and_launch_abi_round_trip(arch: str) -> None:
    import json

    from tlc.backend_cute.kir_codec import decode, encode
    from tlc.kir.text import parse_kir, print_kir
    from tlc.lowering.abi import LaunchABI

    _, kir, abi = lowered(arch)
    text = print_kir(kir)
    assert "load(p.kv_lengths_ptr, batch_idx, batch_idx >= 0 && batch_idx < p.batch)" in text
    assert print_kir(parse_kir(text)) == text
    assert print_kir(decode(json.loads(json.dumps(encode({"p": kir}))))["p"]) == text
    assert LaunchABI.from_json(abi.name, json.loads(json.dumps(abi.to_json()))) == abi
    assert abi.tensor_inputs[2] == ("kv_lengths", "int32", ("batch",))


# ------------------------------------------------------------------ a row extent read from a tensor Input

KV_SPEC = ROOT / "specs" / "kv_lengths_fwd.tl"


def test_a_row_extent_that_reads_a_tensor_is_min_of_what_is_seen_and_what_is_held() -> None:
    spec = KV_SPEC.read_text()
    bad = spec.replace("(min(kv_lengths[batch_idx], seqlen_k), HeadDim)", "(kv_lengths[batch_idx], HeadDim)", 1)
    assert any(":31:1: 'K': a row extent that reads a tensor Input is 'min(E, R)'" in e for e in errors(bad))
    cols = spec.replace("(min(kv_lengths[batch_idx], seqlen_k), HeadDim)", "(seqlen_k, kv_lengths[0])", 1)
    assert any(":31:1: the shape of 'K' cannot read a tensor Input" in e for e in errors(cols))
    _, _, abi = lowered_kv("sm_90")
    assert [(t.name, t.rows) for t in abi.tensors] == [("Q", "seqlen_q"), ("K", "seqlen_k"), ("V", "seqlen_k"),
                                                       ("O", "seqlen_q")]


@lru_cache(maxsize=None)
def lowered_kv(arch: str, causal: str = "false"):
    graph, _ = compile_graph(KV_SPEC.read_text(), "kv.tl", defines=dict(SMALL, Causal=causal))
    state, notes = run_lowering(graph, arch, name="kv")
    return graph, state.kir, state.abi


def kv_inputs(sq: int, sk: int, seed: int) -> tuple[dict, dict]:
    """Q, K, V (3 sequences, GQA 4/2) with K and V NaN in every row past the sequence's length."""
    g = torch.Generator().manual_seed(seed)
    t = {n: torch.randn(3, 4 if n == "Q" else 2, sq if n == "Q" else sk, 32, generator=g).to(torch.bfloat16).double()
         for n in "QKV"}
    lengths = torch.tensor([0, sk // 2 + 1, sk + 7], dtype=torch.int32)
    for b, n in enumerate(lengths.tolist()):
        t["K"][b, :, n:] = float("nan")
        t["V"][b, :, n:] = float("nan")
    return t, {"seqlen_q": sq, "seqlen_k": sk, "scale": 1 / math.sqrt(32), "kv_lengths": lengths}


@pytest.mark.parametrize("causal", ["false", "true"])
@pytest.mark.parametrize("sq, sk", [(1, 1), (17, 33), (65, 63), (70, 9), (5, 130)])
def test_rows_past_a_sequences_length_are_never_read(causal: str, sq: int, sk: int) -> None:
    """Interpreter = a dense reference over each sequence's own keys, and the sm_90 kernel IR = the
    interpreter, with the rows past each length NaN: none reaches an output."""
    from tests.frontend.document_reference import kv_lengths_attention

    graph, kir, abi = lowered_kv("sm_90", causal)
    t, runtime = kv_inputs(sq, sk, sq * 17 + sk)
    want = run_program(graph, dict(t, O=torch.full((3, 4, sq, 32), float("nan"), dtype=torch.float64)), runtime)["O"]
    dense = kv_lengths_attention(t["Q"], t["K"], t["V"], scale=runtime["scale"], kv_lengths=runtime["kv_lengths"],
                                 causal=causal == "true")
    assert torch.isfinite(want).all() and (want - dense).abs().max().item() < 1e-9
    got = evaluate_program(kir, abi, t, runtime)["O"]
    assert torch.isfinite(got).all()
    assert (got - want).abs().max().item() <= 1e-2 * max(1.0, want.abs().max().item())


def test_sm90a_loads_a_tensor_seen_to_a_runtime_extent_by_cp_async() -> None:
    """TMA fills only past the tensor's end: warp specialization declines, the kernel keeps cp.async and
    wgmma, and its protocol holds for any loaded length."""
    from tlc.kir import ops_sm90 as H

    _, kir, _ = lowered_kv("sm_90a", "true")
    assert not any(isinstance(op, H.TmaDescriptorOp) for op in K.walk(kir))
    assert any(type(op).__name__.startswith("Wgmma") for op in K.walk(kir))
    assert protocol_problems(kir) == []


# ------------------------------------------------------------------ review regressions


@pytest.mark.parametrize("text, where, message", [
    (with_lines("Input x : int32[2.5]\n"), "22:1", "a tensor Input's dimension is a whole number of elements, not '2.5'"),
    (with_lines("Input x : int32[-3]\n"), "22:1", "a tensor Input's dimension is a whole number of elements, not '-3'"),
    (with_lines("Input x : int32[batch]\n", mask="kv_idx > x[scale]"), "43:24",
     "'x[scale]' indexes with 'scale', which is not an integer"),
    (with_lines("Input w : fp32[batch]\n", loop="for n = 0:w[batch_idx] / BN"), "36:1",
     "the loop bound 'w[batch_idx] / BN' reads 'w[batch_idx]', which is not an integer"),
])
def test_what_is_not_a_whole_number_is_refused(text: str, where: str, message: str) -> None:
    found = errors(text)
    assert any(f"t.tl:{where}:" in e and message in e for e in found), found


def _sm90_against_interpreter(text: str, runtime_of, sizes, defines=SMALL) -> None:
    graph, _ = compile_graph(text, "r.tl", defines=defines)
    state, _ = run_lowering(graph, "sm_90", name="r")
    for sq, sk in sizes:
        t, runtime = kv_inputs(sq, sk, sq + sk)
        runtime.update(runtime_of(sq, sk))
        want = run_program(graph, dict(t, O=torch.full((3, 4, sq, 32), float("nan"), dtype=torch.float64)), runtime)
        got = evaluate_program(state.kir, state.abi, t, runtime)
        assert torch.isfinite(got["O"]).all() == torch.isfinite(want["O"]).all()
        err = (got["O"] - want["O"]).nan_to_num(0.0).abs().max().item()
        assert err <= 1e-2 * max(1.0, want["O"].nan_to_num(0.0).abs().max().item()), (sq, sk, err)


def test_a_division_in_a_dimension_floors_in_a_loop_bound_too() -> None:
    """`int32[batch, seqlen_q / 2]` read in a loop's stop: the element's position floors its `/` (the stop rounds
    only its own up), in the interpreter and the kernel alike."""
    text = KV_SPEC.read_text().replace("Input kv_lengths : int32[batch]", "Input kv_lengths : int32[batch]\n"
                                       "Input t2 : int32[batch, seqlen_q / 2]").replace(
        "for n = 0:min(kv_lengths[batch_idx], seqlen_k) / BN", "for n = 0:min(t2[batch_idx, 1], seqlen_k) / BN")
    t2 = lambda sq, sk: {"t2": torch.arange(3 * (sq // 2), dtype=torch.int32).reshape(3, sq // 2) % (sk + 1)}
    _sm90_against_interpreter(text, t2, [(17, 33), (4, 40)])
    source = emit_text(text.encode(), "r.tl", "sm_90", SMALL, "cute", line_directives=False)
    assert "p.t2_ptr[batch_idx * tlc::floor_div(p.seqlen_q, 2) + 1]" in source


def test_a_causal_mask_over_a_tensor_seen_to_an_extent_shifts_by_the_rows_held() -> None:
    """bottom-right: the diagonal's shift is seqlen_k − seqlen_q (the Inputs, R of min(E, R)), as written."""
    text = KV_SPEC.read_text().replace(
        "  Compute Mask S where kv_idx > q_idx + min(kv_lengths[batch_idx], seqlen_k) - seqlen_q and get new S when Causal",
        "  Compute Mask S causal bottom_right and get new S")
    _sm90_against_interpreter(text, lambda sq, sk: {}, [(70, 45), (17, 33), (45, 70)])


def test_a_bound_read_as_the_largest_int_does_not_overflow_the_derived_trips() -> None:
    """kv_idx > x[b] with x = 2^31 − 1 (a sentinel): the stop and the first partial trip are spelled without
    a + 1 on the bound (floor_div(max(x, -1), BN) + 1), which C's int would overflow."""
    text = with_lines("Input x : int32[batch]\n", mask="kv_idx > x[batch_idx]")
    source = emit_text(text.encode(), "t.tl", "sm_90", SMALL, "cute", line_directives=False)
    assert "tlc::floor_div(tlc::max(((batch_idx >= 0 && batch_idx < p.batch) ? p.x_ptr[batch_idx] : 0), -1), 32) + 1" \
        in source
    assert "p.x_ptr[batch_idx] : 0) + 1" not in source


def test_the_launcher_refuses_an_input_the_kernel_does_not_have(monkeypatch) -> None:
    from bench.launch_stand_ins import no_gpu, qkv, record, stand_in_kernel

    no_gpu(monkeypatch.setattr)
    _, kir, abi = lowered_kv("sm_90a")
    kernel = stand_in_kernel(kir, abi)
    record(monkeypatch.setattr, ctypes.sizeof(kernel._struct))
    q, k, v = qkv(3, 4, 2, 40, 50, False, d=32)
    lengths = torch.tensor([1, 2, 3], dtype=torch.int32)
    with pytest.raises(TlcError, match="this kernel has no Input 'scael'; its Inputs are kv_lengths, scale, seqlen_k"):
        kernel(q, k, v, kv_lengths=lengths, scael=0.1)
