"""specs/decode_fwd.tl and specs/paged_decode_fwd.tl (split-KV with per-sequence lengths; the second with K and V
gathered from pages): the interpreter of each program equals an independent float64 attention per sequence
(tests/frontend/document_reference.py, tests/frontend/paged_reference.py) for several splits, causal at each
sequence's length included; their sm_90 kernels run in order on the tile evaluator (each kernel's fp32
workspaces handed to the next) equal the interpreter at odd sizes, lengths 0 and past the cache included."""
from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path

import pytest
import torch

from tests.frontend.document_reference import kv_lengths_attention
from tests.frontend.paged_reference import unpaged
from tlc.api import compile_module
from tlc.builder import lower_to_kernel_ir, module_kernel_name
from tlc.ir.module import run_module
from tlc.kir.tile_eval import evaluate_program

SPECS = Path(__file__).resolve().parents[2] / "specs"
D, PAGE = 32, 16


def defines(splits: int, causal: bool) -> dict[str, str]:
    return {"HeadDim": str(D), "BM": "64", "BN": "32", "Splits": str(splits), "Causal": str(causal).lower()}


def inputs(spec: str, b: int, h: int, kvh: int, sq: int, sk: int, seed: int):
    """Q, the caches (dense, or as a pool of scattered pages with NaN where no sequence reads) and the Inputs."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, sq, D, generator=g).to(torch.bfloat16).double()
    k, v = (torch.randn(b, kvh, sk, D, generator=g).to(torch.bfloat16).double() for _ in range(2))
    lengths = torch.tensor([0, sk, sk + 7, sk // 2 + 1][:b], dtype=torch.int32)
    scalars = {"seqlen_q": sq, "seqlen_k": sk, "scale": 1 / math.sqrt(D), "kv_lengths": lengths}
    for i, n in enumerate(lengths.tolist()):
        k[i, :, n:], v[i, :, n:] = float("nan"), float("nan")
    if spec == "decode_fwd":
        return {"Q": q, "K": k, "V": v}, scalars, (k, v)
    per = -(-sk // PAGE)
    table = torch.randperm(b * per + 2, generator=g)[:b * per].view(b, per).to(torch.int32)
    pools = []
    for t in (k, v):
        pool = torch.full((1, kvh, (b * per + 2) * PAGE, D), float("nan"), dtype=torch.float64)
        for i in range(b):
            for r in range(min(int(lengths[i]), sk)):
                pool[0, :, int(table[i, r // PAGE]) * PAGE + r % PAGE] = t[i, :, r]
        pools.append(pool)
    return {"Q": q, "K": pools[0], "V": pools[1]}, dict(scalars, block_table=table), (k, v)


def workspaces(tensors: dict, roles: dict, splits: int) -> dict:
    b, h, sq, _ = tensors["Q"].shape
    out = dict(tensors)
    for name, role in roles.items():
        if role != "input":
            heads = h * splits if name.endswith("_part") else h
            out[name] = torch.full((b, heads, sq, D) if name.startswith("O") else (b, heads, sq), float("nan"),
                                   dtype=torch.float64)
    return out


@pytest.mark.parametrize("spec", ["decode_fwd", "paged_decode_fwd"])
@pytest.mark.parametrize("splits, causal", [(1, False), (3, False), (4, True)])
@pytest.mark.parametrize("sq, sk", [(1, 1), (1, 100), (3, 70)])
def test_the_program_equals_attention_over_each_sequence(spec: str, splits: int, causal: bool, sq: int, sk: int) -> None:
    module, _ = compile_module((SPECS / f"{spec}.tl").read_text(), f"{spec}.tl", defines=defines(splits, causal),
                               run_passes=False)
    tensors, scalars, (k, v) = inputs(spec, 4, 4, 2, sq, sk, splits * 100 + sk)
    got = run_module(module, workspaces(tensors, module.roles(), splits), scalars)["O"]
    want = kv_lengths_attention(tensors["Q"], k.nan_to_num(0.0), v.nan_to_num(0.0), scale=scalars["scale"],
                                kv_lengths=scalars["kv_lengths"], causal=causal)
    if spec == "paged_decode_fwd":   # the reference reads the pages itself
        rows = unpaged(tensors["K"], scalars["block_table"], PAGE, sk)
        assert torch.equal(rows.nan_to_num(0.0)[:, :, :1], k.nan_to_num(0.0)[:, :, :1])
    assert (got - want).abs().max().item() < 1e-10


@lru_cache(maxsize=None)
def lowered(spec: str, splits: int, causal: bool):
    data = (SPECS / f"{spec}.tl").read_bytes()
    return [lower_to_kernel_ir(data, f"{spec}.tl", "sm_90", defines(splits, causal),
                               name=module_kernel_name(f"{spec}.tl", k), kernel=k)[0] for k in ("partial", "combine")]


@pytest.mark.parametrize("spec", ["decode_fwd", "paged_decode_fwd"])
@pytest.mark.parametrize("sq, sk, splits, causal", [(1, 1, 4, False), (4, 100, 4, False), (3, 70, 2, True),
                                                      (65, 33, 3, True)])
def test_the_kernels_in_order_equal_the_interpreter(spec: str, sq: int, sk: int, splits: int, causal: bool) -> None:
    module, _ = compile_module((SPECS / f"{spec}.tl").read_text(), f"{spec}.tl", defines=defines(splits, causal),
                               run_passes=False)
    tensors, scalars, _ = inputs(spec, 4, 4, 2, sq, sk, sq * 100 + sk)
    want = run_module(module, workspaces(tensors, module.roles(), splits), scalars)
    env = dict(tensors)
    for state in lowered(spec, splits, causal):
        ins = {a.name: env[a.name] for a in state.abi.tensors if not a.output}
        runtime = {k: v for k, v in scalars.items() if k in dict(state.abi.inputs)
                   or k in {n for n, _, _ in state.abi.tensor_inputs}}
        env.update(evaluate_program(state.kir, state.abi, ins, runtime))
    assert not torch.isnan(env["O"]).any()
    err = (env["O"] - want["O"]).abs().max().item()
    assert err <= 2e-2 * max(1.0, want["O"].abs().max().item()), f"{spec} {sq}x{sk}: {err:.3e}"
    finite = torch.isfinite(want["LSE"])
    assert torch.equal(torch.isfinite(env["LSE"]), finite)
    assert (env["LSE"][finite] - want["LSE"][finite]).abs().max().item() < 1e-3


@pytest.mark.parametrize("rows, warps", [(16, 1), (32, 2), (64, 4)])
def test_a_kernel_without_gemms_takes_a_warp_per_16_rows(rows: int, warps: int) -> None:
    """The combine on 16-row blocks (the spec's CM) runs one warp (unless Param Warps says), its kernels in order
    still equal the interpreter: more blocks for a program with few rows per head (decode with heads as rows)."""
    text = (SPECS / "decode_fwd.tl").read_text()
    bound = dict(defines(4, False), CM=str(rows))
    states = [lower_to_kernel_ir(text.encode(), "d.tl", "sm_90", bound, name=module_kernel_name("d.tl", k),
                                 kernel=k)[0] for k in ("partial", "combine")]
    combine = states[1].kir.kernels()[0]
    assert combine.threads == 32 * warps and str(combine.grid[0]) == f"ceil_div(p.seqlen_q, {rows})"
    module, _ = compile_module(text, "d.tl", defines=bound, run_passes=False)
    tensors, scalars, _ = inputs("decode_fwd", 4, 4, 2, 37, 100, 3)
    want = run_module(module, workspaces(tensors, module.roles(), 4), scalars)
    env = dict(tensors)
    for state in states:
        ins = {a.name: env[a.name] for a in state.abi.tensors if not a.output}
        runtime = {k: v for k, v in scalars.items() if k in dict(state.abi.inputs)
                   or k in {n for n, _, _ in state.abi.tensor_inputs}}
        env.update(evaluate_program(state.kir, state.abi, ins, runtime))
    err = (env["O"] - want["O"]).abs().max().item()
    assert not torch.isnan(env["O"]).any() and err <= 2e-2 * max(1.0, want["O"].abs().max().item())
