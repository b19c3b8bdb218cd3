"""`[L = block_idx from end]`: the block's row tile counted from the tensor's end. It parses and
formats back, means rows `extent − (L+1)·tile …` in the interpreter (the partial tile first, its
rows before 0 absent), and is refused with its line and column where the compiler does not
support it (another coordinate, another axis)."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from tlc.api import check_source, compile_graph
from tlc.frontend.format import format_program
from tlc.frontend.parser import parse_text
from tlc.ir.interpreter import run_program

ROOT = Path(__file__).resolve().parents[2]
MHA = "".join(line for line in (ROOT / "specs" / "mha_fwd.tl").read_text().splitlines(True) if not line.startswith("#"))
Q_COPY = "Copy Q (BM, HeadDim) in coordinate [L = block_idx] from global to shared"
O_COPY = "Copy O (BM, HeadDim) in coordinate [L = block_idx] from register to global"
FROM_END = MHA.replace(Q_COPY, Q_COPY.replace("block_idx]", "block_idx from end]")).replace(
    O_COPY, O_COPY.replace("block_idx]", "block_idx from end]"))


def errors(text: str) -> list[tuple[int, int, str]]:
    res = check_source(text, "p.tl")
    return [(d.loc.line, d.loc.col, d.message) for d in res.diagnostics if d.severity == "error" and d.loc]


def test_parses_and_formats_back() -> None:
    program = parse_text(FROM_END, "p.tl")
    copies = [s for s in program.body if type(s).__name__ == "CopyStmt" and s.from_end]
    assert [c.name for c in copies] == ["Q", "O"] and all(c.from_end == ("L",) for c in copies)
    text = format_program(program)
    assert "in coordinate [L = block_idx from end] from global to shared" in text
    assert format_program(parse_text(text, "fmt.tl")) == text


def test_keywords_are_case_insensitive() -> None:
    assert errors(FROM_END.replace("block_idx from end]", "block_idx FROM End]")) == []


@pytest.mark.parametrize("old,new,what", [
    ("[L = n]", "[L = n from end]", "'L = n from end' is not supported"),
    ("[L = block_idx] from register", "[C = block_idx from end] from register", "'C = block_idx from end'"),
])
def test_unsupported_uses_are_refused_at_their_line(old: str, new: str, what: str) -> None:
    text = MHA.replace(old, new, 1)
    found = errors(text)
    line, col = next((i, t.index("Copy") + 1) for i, t in enumerate(text.splitlines(), 1) if new in t)
    assert [(ln, c) for ln, c, _ in found] == [(line, col)], found
    assert what in found[0][2] and "[L = block_idx from end]" in found[0][2]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sq,sk", [(1, 1), (5, 7), (17, 9), (33, 40)])
def test_interpreter_counts_tiles_from_the_end(causal: bool, sq: int, sk: int) -> None:
    """Against torch's SDPA (causal top-left): every row is computed exactly once, the partial tile first."""
    defines = {"HeadDim": "8", "BM": "4", "BN": "4", "Causal": "true" if causal else "false"}
    graph, _ = compile_graph(FROM_END, "p.tl", defines=defines)
    gen = torch.Generator().manual_seed(sq * 100 + sk)
    q, k, v = (torch.randn(1, 2, n, 8, generator=gen, dtype=torch.float64) for n in (sq, sk, sk))
    out = torch.full((1, 2, sq, 8), float("nan"), dtype=torch.float64)
    scale = 1 / math.sqrt(8)
    got = run_program(graph, {"Q": q, "K": k, "V": v, "O": out}, {"seqlen_q": sq, "seqlen_k": sk, "scale": scale})["O"]
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    if causal and sq > sk:   # rows with no key (top-left causal, fewer keys than queries) are NaN in SDPA
        want = torch.where(torch.isnan(want), got, want)
    assert not torch.isnan(got).any()
    assert (got - want).abs().max().item() < 1e-9


def _kv_trips(text: str, sq: int, bm: int, bn: int) -> int:
    """KV trips of all blocks of one head, from the causal loop bound the mask pass leaves."""
    from tlc.expr.evaluate import eval_expr
    from tlc.ir.ops import LoopOp

    graph, _ = compile_graph(text, "p.tl", defines={"HeadDim": "64", "BM": str(bm), "BN": str(bn), "Causal": "true"})
    (loop,) = [op for _, op in graph.walk() if isinstance(op, LoopOp)]
    env = {"seqlen_q": sq, "seqlen_k": sq, "BM": bm, "BN": bn}
    return sum(max(0, eval_expr(loop.stop, dict(env, block_idx=b), ceil_div=True)) for b in range(-(-sq // bm)))


def test_causal_trips_at_4096_rows_of_192() -> None:
    """specs/LANGUAGE.md's numbers: 363 KV trips per head from the end against 384 from the start."""
    assert _kv_trips(FROM_END, 4096, 192, 128) == 363 and _kv_trips(MHA, 4096, 192, 128) == 384
