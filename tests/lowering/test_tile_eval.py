"""The kernel IR the lowering produces (after infer-layouts, insert-sync, pipeline, defer-reductions)
computes what the TL interpreter says: every shipped spec that builds and every structural variant,
evaluated at tile level on the CPU (tlc.kir.tile_eval) at small odd sizes. Planted bugs in a
correct kernel IR (a wrong stage, mask offset, missing rescale, wait or barrier) must be caught,
so these tests can fail."""
from __future__ import annotations

import dataclasses
import math
from functools import lru_cache
from pathlib import Path
from typing import Callable

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.lowering.variants import BUILDS
from tlc.api import compile_graph
from tlc.ir.interpreter import run_program
from tlc.kir import ops as K
from tlc.kir.expr import BinOp, Const, E, Index, Var
from tlc.kir.tile_eval import TileEvalError, evaluate_program, known_ops
from tlc.kir.ops_sm90 import SM90_OP_CLASSES
from tlc.kir.tile_eval_expr import eval_tensor_expr
from tlc.lowering.passes import run_lowering

SPECS = Path(__file__).resolve().parents[2] / "specs"
SMALL = {"HeadDim": "32", "BM": "64", "BN": "32"}
CAUSAL = {**SMALL, "Causal": "true"}
# case → (spec file or variant:<name>, defines, (query heads, KV heads))
CASES: dict[str, tuple[str, dict[str, str], tuple[int, int]]] = {
    "mha": ("mha_fwd", SMALL, (2, 2)),
    "mha_causal": ("mha_fwd", CAUSAL, (2, 2)),
    "mha_causal_br": ("mha_fwd", {**CAUSAL, "Align": "bottom_right"}, (2, 2)),
    "mha_d40_causal": ("mha_fwd", {**CAUSAL, "HeadDim": "40"}, (2, 2)),   # columns padded to 64
    "gqa": ("gqa_fwd", SMALL, (4, 2)),
    "gqa_causal_1stage": ("gqa_fwd", {**CAUSAL, "Stages": "1"}, (4, 2)),
    # gqa_fwd.tl counts its query tiles from the end ([L = block_idx from end]): the partial tile comes first
    "gqa_causal": ("gqa_fwd", CAUSAL, (4, 2)),
    "gqa_causal_br_split": ("gqa_fwd", {**CAUSAL, "Align": "bottom_right", "SplitMasked": "true"}, (4, 2)),
    "mqa_causal": ("mqa_fwd", CAUSAL, (2, 1)),
    "mla_prefill": ("mla_prefill_fwd", {"DQK": "48", "DV": "32", "BM": "64", "BN": "32"}, (2, 2)),
    "softcap_causal": ("softcap_fwd", CAUSAL, (2, 2)),
    "b2b": ("b2b_gemm_relu", {"K1": "32", "N2": "32", "BM": "64", "BN": "32"}, (2, 2)),
    "chain3": ("chain3_fwd", {"K1": "32", "N2": "32", "N3": "48", "BM": "64", "BN": "32"}, (2, 2)),
    "mla_decode_causal": ("mla_decode_fwd", {"DQK": "64", "DV": "32", "BM": "64", "BN": "32", "Causal": "true"},
                          (2, 1)),
    # 16 rows on 4 warps: scores replicated per warp, O split by columns (tlc/lowering/warps.py)
    "mla_decode_16rows": ("mla_decode_fwd", {"DQK": "64", "DV": "128", "BM": "16", "BN": "32"}, (2, 1)),
    "mla_decode_32rows_8warps": ("mla_decode_fwd", {"DQK": "64", "DV": "128", "BM": "32", "BN": "32", "Warps": "8"},
                                 (2, 1)),
    "mla_decode_16rows_causal": ("mla_decode_fwd", {"DQK": "64", "DV": "64", "BM": "16", "BN": "32",
                                                    "Causal": "true"}, (2, 1)),
    **{f"variant_{k}": (f"variant:{k}", SMALL, (2, 2)) for k in BUILDS},
    # split-masked-trips (on by default only in warp-specialised kernels): the loop without masks, then the rest
    "mha_causal_split": ("mha_fwd", {**CAUSAL, "SplitMasked": "true"}, (2, 2)),
    "mha_causal_br_split": ("mha_fwd", {**CAUSAL, "Align": "bottom_right", "SplitMasked": "true"}, (2, 2)),
    "gqa_split": ("gqa_fwd", {**SMALL, "SplitMasked": "true"}, (4, 2)),
    "softcap_causal_split": ("softcap_fwd", {**CAUSAL, "SplitMasked": "true"}, (2, 2)),
    # lazy-rescale (likewise): a stale running max within 2^8, the output rescaled when a row moved
    "mha_causal_lazy": ("mha_fwd", {**CAUSAL, "LazyRescale": "true", "SplitMasked": "true"}, (2, 2)),
    "gqa_lazy": ("gqa_fwd", {**SMALL, "LazyRescale": "true"}, (4, 2)),
    "softcap_causal_lazy": ("softcap_fwd", {**CAUSAL, "LazyRescale": "true"}, (2, 2)),
    # trace-phases: the timeline's stamps change no value
    "mha_causal_trace": ("mha_fwd", {**CAUSAL, "Trace": "true", "SplitMasked": "true"}, (2, 2)),
}
SIZES = [(1, 1), (17, 33), (70, 9), (65, 130)]
# Measured max |kernel IR - interpreter| / max(1, max |ref|) over 300 random cases: 4.8e-3 (b2b; bf16 P and O).
TOL = 1e-2


@lru_cache(maxsize=None)
def lowered(case: str):
    spec, defines, _ = CASES[case]
    if spec.startswith("variant:"):
        text, path = BUILDS[spec.split(":")[1]], f"mha_{spec.split(':')[1]}.tl"
    else:
        path = str(SPECS / f"{spec}.tl")
        text = Path(path).read_text()
    graph, _ = compile_graph(text, path, defines=defines)
    state, _ = run_lowering(graph, "sm_90", name=Path(path).stem)
    return graph, state.kir, state.abi


def inputs(case: str, sq: int, sk: int, batch: int):
    graph, _, abi = lowered(case)
    heads, kv_heads = CASES[case][2]
    gen = torch.Generator().manual_seed(sq * 1000 + sk)
    rows = {"seqlen_q": sq, "seqlen_k": sk}
    tensors = {}
    for arg in abi.tensors:
        if not arg.output:
            n = rows[arg.rows] if arg.rows in rows else int(arg.rows)
            h = heads if arg.head == "head_idx" else kv_heads
            tensors[arg.name] = torch.randn(batch, h, n, arg.cols, generator=gen).to(torch.bfloat16).double()
    scalars: dict[str, float | int] = {k: v for k, v in rows.items() if k in graph.inputs}
    if "scale" in graph.inputs:
        scalars["scale"] = 1.0 / math.sqrt(abi.tensors[0].cols)
    return tensors, scalars


def reference(case: str, tensors, scalars, batch: int) -> dict[str, torch.Tensor]:
    graph, _, abi = lowered(case)
    heads = CASES[case][2][0]
    given = dict(tensors)
    for arg in abi.tensors:
        if arg.output:
            n = int(scalars[arg.rows]) if arg.rows in scalars else int(arg.rows)
            given[arg.name] = torch.full((batch, heads, n, arg.cols), float("nan"), dtype=torch.float64)
    out = run_program(graph, given, scalars)
    return {a.name: out[a.name] for a in abi.tensors if a.output}


def mismatch(case: str, sq: int, sk: int, batch: int = 1, program: K.ProgramOp | None = None) -> str:
    """'' when the kernel IR (default: the lowered one) equals the interpreter, else why not."""
    _, kir, abi = lowered(case)
    tensors, scalars = inputs(case, sq, sk, batch)
    ref = reference(case, tensors, scalars, batch)
    got = evaluate_program(program or kir, abi, tensors, scalars)
    for name, r in ref.items():
        o = got[name]
        if o.shape != r.shape:
            return f"{name}: shape {tuple(o.shape)} != {tuple(r.shape)}"
        if (torch.isnan(o) != torch.isnan(r)).any():
            return f"{name}: {int(torch.isnan(o).sum())} NaN elements, the interpreter {int(torch.isnan(r).sum())}"
        if r.numel():
            err, bound = (o - r).abs().max().item(), TOL * max(1.0, r.abs().max().item())
            if not err <= bound:
                return f"{name}: max |kernel IR - interpreter| = {err:.3e} > {bound:.3e}"
    return ""


@pytest.mark.parametrize("sq,sk", SIZES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_kernel_ir_equals_interpreter(case: str, sq: int, sk: int) -> None:
    assert mismatch(case, sq, sk, batch=2 if (sq * sk) % 2 else 1) == ""


@settings(max_examples=20, deadline=None, derandomize=True)
@given(case=st.sampled_from(["mha_causal", "mha_causal_br", "gqa", "mqa_causal", "softcap_causal", "chain3",
                             "mla_prefill", "gqa_causal_1stage", "gqa_causal_br_split"]),
       sq=st.integers(1, 160), sk=st.integers(1, 160), batch=st.integers(1, 2))
def test_kernel_ir_equals_interpreter_at_random_sizes(case: str, sq: int, sk: int, batch: int) -> None:
    assert mismatch(case, sq, sk, batch) == ""


def test_causal_mha_equals_torch_sdpa() -> None:
    """An oracle independent of the TL interpreter: torch's SDPA (causal is top-left aligned there)."""
    _, kir, abi = lowered("mha_causal")
    tensors, scalars = inputs("mha_causal", 65, 130, 2)
    got = evaluate_program(kir, abi, tensors, scalars)["O"]
    q, k, v = (tensors[n] for n in "QKV")
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scalars["scale"])
    assert (got - want).abs().max().item() <= TOL * max(1.0, want.abs().max().item())


# ----------------------------------------------------------------------------- planted bugs
def mutate(program: K.ProgramOp, fn: Callable[[K.Op], K.Op | None]) -> K.ProgramOp:
    """`program` with `fn` applied to every op (None drops it); fails unless some op changed."""
    changed = []

    def walk(op: K.Op) -> K.Op | None:
        regions = {r: tuple(x for x in (walk(c) for c in getattr(op, r)) if x is not None) for r in op.regions}
        op = dataclasses.replace(op, **regions) if regions else op
        new = fn(op)
        if new is not op:
            changed.append(op)
        return new

    out = walk(program)
    assert changed, "the mutation matched no op"
    return out  # type: ignore[return-value]


def _other_stage(op: K.Op) -> K.Op:
    if isinstance(op, K.CopyOp) and op.kblock is not None and isinstance(op.src, Index) and "sK" in str(op.src):
        idx = op.src.indices[:-1] + (E(f"({op.src.indices[-1]} + 1) % 2"),)
        return dataclasses.replace(op, src=Index(op.src.base, idx))
    return op


def _kblock_not_prefetched(op: K.Op) -> K.Op:
    """The k-block loop without its load of k-block kb + 1."""
    if isinstance(op, K.ForOp) and op.unroll:
        return dataclasses.replace(op, body=tuple(x for x in op.body if not isinstance(x, K.IfOp)))
    return op


def _prefetch_loads_this_kblock(op: K.Op) -> K.Op:
    if isinstance(op, K.CopyOp) and op.kblock is not None and "+ 1" in str(op.kblock):
        return dataclasses.replace(op, kblock=E(str(op.kblock).replace(" + 1", "")))
    return op


def _first_kblock_of_v_not_loaded(op: K.Op) -> K.Op | None:
    """Drop the load of V's k-block 0 before the P·V loop."""
    if isinstance(op, K.CopyOp) and op.kblock == Const(0) and "sV" in str(op.src):
        return None
    return op


def _shift_mask(op: K.Op) -> K.Op:
    if isinstance(op, K.MaskOp) and op.causal:
        return dataclasses.replace(op, col0=E(f"{op.col0} + 1"))
    return op


def _drop_rescale(op: K.Op) -> K.Op | None:
    return None if isinstance(op, K.RowBroadcastOp) and str(op.fn) == "x * r" else op


def _drop_loop_wait(op: K.Op) -> K.Op:
    if isinstance(op, K.ForOp):
        return dataclasses.replace(op, body=tuple(x for x in op.body if not isinstance(x, K.WaitOp)))
    return op


def _drop_first_loop_barrier(op: K.Op) -> K.Op:
    if isinstance(op, K.ForOp) and not op.unroll:
        i = next(i for i, x in enumerate(op.body) if isinstance(x, K.BarrierOp))
        return dataclasses.replace(op, body=op.body[:i] + op.body[i + 1:])
    return op


def _prefetch_same_tile(op: K.Op) -> K.Op:
    if isinstance(op, K.AsyncCopyOp) and "n + 1" in str(op.src):
        return dataclasses.replace(op, src=E(str(op.src).replace("n + 1", "n")))
    return op


def _kv_head_not_grouped(op: K.Op) -> K.Op:
    if isinstance(op, K.GlobalTensorOp) and "group" in str(op.offset):
        return dataclasses.replace(op, offset=E(str(op.offset).replace("floor_div(head_idx, group)", "head_idx")))
    return op


def _no_store_predicate(op: K.Op) -> K.Op:
    if isinstance(op, K.CopyOp) and op.row_limit is not None:
        return dataclasses.replace(op, pred=None, row_limit=None)
    return op


def _epilogue_without_barrier(op: K.Op) -> K.Op:
    if isinstance(op, K.KernelOp):
        body = list(op.body)
        r2s = next(i for i, x in enumerate(body) if isinstance(x, K.CopyOp) and x.writes)
        assert isinstance(body[r2s + 1], K.BarrierOp)
        return dataclasses.replace(op, body=tuple(body[:r2s + 1] + body[r2s + 2:]))
    return op


def _block_idx_halved(op: K.Op) -> K.Op:
    if isinstance(op, K.LetOp) and op.name == "block_idx":
        return dataclasses.replace(op, value=E(f"({op.value}) / 2"))
    return op


def _p_in_fp32(op: K.Op) -> K.Op:
    return dataclasses.replace(op, dtype="fp32") if isinstance(op, K.ConvertOp) and op.name == "rP" else op


# name → (case, mutation, sizes, what must be reported: an error message part, or "mismatch")
MUTATIONS = {
    "gemm_reads_other_stage": ("mha", _other_stage, (17, 70), "in flight"),
    "kblock_used_before_its_load": ("mha", _kblock_not_prefetched, (17, 70), "before any load fills it"),
    "prefetch_loads_the_current_kblock": ("mha", _prefetch_loads_this_kblock, (17, 70), "before any load fills it"),
    "first_kblock_of_v_not_loaded": ("mha", _first_kblock_of_v_not_loaded, (17, 130), "before any load fills it"),
    "mask_col0_off_by_one": ("mha_causal", _shift_mask, (65, 130), "mismatch"),
    "no_rescale_of_o": ("mha", _drop_rescale, (65, 130), "mismatch"),
    "no_wait_in_loop": ("mha", _drop_loop_wait, (17, 33), "in flight"),
    "no_barrier_before_prefetch": ("mha", _drop_first_loop_barrier, (17, 70), "read since the last barrier"),
    "prefetch_current_tile": ("mha", _prefetch_same_tile, (17, 70), "mismatch"),
    "kv_head_ignores_group": ("gqa", _kv_head_not_grouped, (17, 33), "reaches outside tensor K"),
    "store_without_row_predicate": ("mha", _no_store_predicate, (17, 33), "touches rows"),
    "epilogue_store_without_barrier": ("mha", _epilogue_without_barrier, (17, 33), "with no BarrierOp"),
    "p_not_converted_to_bf16": ("mha", _p_in_fp32, (17, 33), "bf16/fp16 registers"),
    "two_ctas_store_one_tile": ("mha_causal", _block_idx_halved, (130, 33), "race between CTAs"),
}


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_planted_bug_is_detected(name: str) -> None:
    case, fn, (sq, sk), expect = MUTATIONS[name]
    assert mismatch(case, sq, sk) == "", "the unmutated kernel IR must pass first"
    bad = mutate(lowered(case)[1], fn)
    if expect == "mismatch":
        assert mismatch(case, sq, sk, program=bad).startswith("O: max |kernel IR - interpreter|")
    else:
        with pytest.raises(TileEvalError, match=expect):
            mismatch(case, sq, sk, program=bad)


def test_kernel_ir_before_insert_sync_is_refused() -> None:
    """lower-tile-ops emits no waits or barriers: its GEMM reads a tile whose copy is in flight."""
    from tlc.lowering.state import start_state
    from tlc.passes.base import PassContext
    from tlc.passes.pipeline import PassManager, parse_pipeline

    spec, defines, _ = CASES["mha"]
    graph, _ = compile_graph((SPECS / f"{spec}.tl").read_text(), f"{spec}.tl", defines=defines)
    ctx = PassContext(arch="sm_90")
    start_state(ctx, "sm_90", name=spec)
    PassManager(parse_pipeline("lower-tile-ops")).run(graph, ctx)
    tensors, scalars = inputs("mha", 17, 33, 1)
    with pytest.raises(TileEvalError, match="never committed|in flight") as exc:
        evaluate_program(ctx.lowering.kir, lowered("mha")[2], tensors, scalars)
    assert exc.value.diagnostics[0].loc is not None and exc.value.diagnostics[0].loc.line > 0


# ----------------------------------------------------------------------------- small pieces
def test_unknown_op_is_refused_with_the_known_ones() -> None:
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class ShuffleOp(K.Op):
        """Not a kernel-IR op."""

    kir = mutate(lowered("mha")[1], lambda op: ShuffleOp() if isinstance(op, K.AllReduceOp) else op)
    with pytest.raises(TileEvalError, match="ShuffleOp has no tile-level meaning") as exc:
        mismatch("mha", 17, 33, program=kir)
    assert "MmaOp" in str(exc.value)
    # the Hopper ops (tlc/kir/ops_sm90.py) have no tile-level meaning yet: refused like any unknown op
    hopper = {name for name, cls in K.OP_CLASSES.items() if issubclass(cls, SM90_OP_CLASSES)}   # views of them too
    assert set(known_ops()) == set(K.OP_CLASSES) - {"ProgramOp", "KernelOp", "ParamsOp", "LaunchOp"} - hopper


def test_elementwise_functions() -> None:
    x = torch.tensor([[-1.0, 0.0, 2.0, float("nan")]], dtype=torch.float64)
    r = torch.tensor([[2.0]], dtype=torch.float64)
    env = {"x": x, "r": r}
    scal = {"s": 3, "p.cap": 0.5}

    def ev(text: str) -> list[float]:
        return eval_tensor_expr(E(text), env, scal).expand(x.shape).to(torch.float64).flatten().tolist()

    assert ev("select(r == 0.0, 0.0, x / r)")[:3] == [-0.5, 0.0, 1.0]
    assert ev("max(x, 0.0)") == [0.0, 0.0, 2.0, 0.0]          # fmaxf: NaN loses
    assert ev("isnan(x)") == [0.0, 0.0, 0.0, 1.0]
    assert ev("exp2(x * s - 3.0)")[2] == 8.0
    assert ev("tanh(x * p.cap) / p.cap")[1] == 0.0
    assert ev("x < 0.0 || x > 1.0")[:3] == [1.0, 0.0, 1.0]
    assert ev("abs(-x) + sqrt(r) * sqrt(r)")[0] == pytest.approx(3.0)
    assert ev("7 / 2 + x * 0.0")[0] == 3.0                   # scalar-only subtrees keep C's integer `/`


def test_row_store_writes_a_vector() -> None:
    """RowStoreOp (no TL program produces it yet): the running row max m, stored per query row."""
    from tlc.lowering.abi import TensorArg

    graph, kir, abi = lowered("mha")
    kernel = kir.kernels()[0]
    vec = TensorArg("M", "bf16", "seqlen_q", 1, "head_idx", True)
    abi2 = dataclasses.replace(abi, tensors=abi.tensors + (vec,))
    params = dataclasses.replace(abi.params_op(), fields=abi2.fields())
    decl = [K.GlobalTensorOp(name="mM", dtype="bf16", ptr=Var("p.M_ptr"),
                             offset=E("batch_idx * p.M_batch_stride + head_idx * p.M_head_stride"),
                             rows=Var("p.seqlen_q"), cols=0, row_stride=E(1)),
            K.GlobalTileOp(name="gM", src="mM", tile=(64,), coord=(Var("block_idx"),))]
    store = K.RowStoreOp(dst="gM", vec="m", coord="tSc64x32", row_limit=E("p.seqlen_q - block_idx * 64"))
    body = list(kernel.body)
    loop = max(i for i, op in enumerate(body) if isinstance(op, K.ForOp))
    body = body[:loop] + decl + [body[loop], store] + body[loop + 1:]
    program = K.ProgramOp(name=kir.name, body=(params, dataclasses.replace(kernel, body=tuple(body))))
    tensors, scalars = inputs("mha", 70, 33, 1)
    out = evaluate_program(program, abi2, tensors, scalars)["M"][..., 0]
    q, k = tensors["Q"], tensors["K"]
    want = (q @ k.transpose(-1, -2)).amax(dim=-1)            # m is the unscaled row max of S
    assert torch.allclose(out, want.to(torch.bfloat16).double(), rtol=1e-2, atol=1e-2)


def test_counters_and_break_end_a_loop_where_the_program_says() -> None:
    """CounterOp/CounterAddOp/CounterSetOp and BreakOp (a persistent kernel's scheduler ops) evaluate
    as their C++: the KV loop run to a huge bound and broken off after `trips` trips, `trips` a counter
    set to 0, advanced by the loop's own bound and set again, equals the interpreter; broken off one
    trip early, it does not."""
    _, kir, _ = lowered("mha")

    def rebuilt(early: int) -> K.ProgramOp:
        def fn(op: K.Op) -> K.Op:
            if not isinstance(op, K.KernelOp):
                return op
            at = next(i for i, x in enumerate(op.body) if isinstance(x, K.ForOp) and x.var == "n")
            loop = op.body[at]
            stop = BinOp("-", Var("trips"), Const(1 + early))
            loop = dataclasses.replace(loop, stop=Const(10**6), body=(
                *loop.body, K.IfOp(cond=BinOp(">=", Var("n"), stop), body=(K.BreakOp(),))))
            counters = (K.CounterOp(name="trips", init=Const(0)), K.CounterAddOp(counter="trips", value=loop.stop),
                        K.CounterAddOp(counter="trips", value=op.body[at].stop),
                        K.CounterSetOp(counter="trips", value=BinOp("-", Var("trips"), Const(10**6))))
            return dataclasses.replace(op, body=(*op.body[:at], *counters, loop, *op.body[at + 1:]))
        return mutate(kir, fn)

    assert mismatch("mha", 17, 200, program=rebuilt(0)) == ""
    assert mismatch("mha", 17, 200, program=rebuilt(1)) != ""
