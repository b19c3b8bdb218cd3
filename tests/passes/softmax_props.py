"""Shared properties of the online-softmax and mask tests (and of their mutation tests):
a pass keeps the interpreter's result, that result equals the float64 reference, and a
second run of the pass changes nothing.

Imported by its siblings as a plain module (pytest puts this directory on sys.path).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

import torch
from hypothesis import strategies as st

from tlc.frontend.lower import lower_program
from tlc.frontend.parser import parse_text
from tlc.ir.graph import Graph
from tlc.ir.interpreter import InterpError, run_program
from tlc.ir.printer import print_graph
from tlc.passes.base import Pass, PassContext
from tlc.reference import reference_for
from tlc.testing.checks import Shapes, compare, make_inputs, program_info
from tlc.testing.strategies import ProgramChoices

torch.set_num_threads(1)  # tiny tensors: thread start-up costs more than the arithmetic

SEQLENS = (1, 2, 8, 17, 31, 64)
RTOL = 1e-9

Transform = Callable[[Graph], None]


_parse = lru_cache(maxsize=512)(parse_text)


def lower(text: str, defines: dict[str, str] | None = None) -> Graph:
    """A fresh graph per call (passes rewrite in place); the parse is cached."""
    return lower_program(_parse(text), dict(defines or {}))


def apply(*passes: Pass) -> Transform:
    def run(graph: Graph) -> None:
        ctx = PassContext()
        for p in passes:
            p.apply(ctx, graph)
        ctx.sink.raise_if_errors()

    return run


@st.composite
def attention_programs(draw, causal: bool | None = None) -> ProgramChoices:
    """Attention programs at tile sizes that keep the interpreter fast, every spelling of
    the softmax (named sum + Divide, or normalised), softcap, transposed K or V, causal."""
    d = draw(st.sampled_from([8, 16]))
    return ProgramChoices(
        bm=draw(st.sampled_from([8, 16])), bn=draw(st.sampled_from([8, 16])), d_qk=d,
        d_v=draw(st.sampled_from([d, 8])), kv=draw(st.sampled_from(["head_idx / group", "head_idx", "0"])),
        causal=draw(st.booleans()) if causal is None else causal,
        align=draw(st.sampled_from(["top_left", "bottom_right"])),
        mask_style=draw(st.sampled_from(["guard", "explicit"])), softcap=draw(st.booleans()),
        transpose=draw(st.sampled_from(["", "K", "V"])), register_copies=draw(st.booleans()),
        named_stats=draw(st.booleans()), bound=draw(st.sampled_from(["div", "cdiv"])))


@st.composite
def shapes(draw, program: ProgramChoices) -> Shapes:
    if program.kv == "head_idx":          # strict MHA
        heads = kv_heads = draw(st.integers(1, 2))
    elif program.kv == "0":               # MQA
        heads, kv_heads = draw(st.integers(1, 2)), 1
    else:                                 # GQA
        kv_heads = draw(st.integers(1, 2))
        heads = kv_heads * draw(st.integers(1, 2))
    ints = {"seqlen_q": draw(st.sampled_from(SEQLENS)), "seqlen_k": draw(st.sampled_from(SEQLENS))}
    scale = draw(st.sampled_from([0.125, 0.3, 1.0]))
    return Shapes(draw(st.integers(1, 2)), heads, kv_heads, ints, {"scale": scale})


def cases(causal: bool | None = None) -> st.SearchStrategy[tuple[ProgramChoices, Shapes, int]]:
    return attention_programs(causal).flatmap(
        lambda p: st.tuples(st.just(p), shapes(p), st.integers(0, 2**16)))


@dataclass
class Outcome:
    ok: bool
    why: str = ""

    def __bool__(self) -> bool:
        return self.ok


def interpret(graph: Graph, sh: Shapes, seed: int, *, check_layouts: bool = False):
    """(program output, float64 reference) on seeded random inputs."""
    interp, ref_in, scalars = make_inputs(graph, sh, seed)
    out = run_program(graph, interp, scalars, check_layouts=check_layouts)
    name, ref = reference_for(graph.params, ref_in, scalars)
    got = out[name]
    if any(t.name == name and t.transposed for t in program_info(graph).tensors):
        got = got.transpose(-1, -2)
    return got, ref


def keeps_meaning(text: str, before: Transform, transform: Transform, sh: Shapes, seed: int,
                  *, defines: dict[str, str] | None = None, check_layouts: bool = False) -> Outcome:
    """`transform` (run after `before`) keeps the interpreter's result, the result equals the
    reference, and running `transform` again leaves the printed IR unchanged."""
    g0 = lower(text, defines)
    before(g0)
    g1 = lower(text, defines)
    before(g1)
    transform(g1)
    printed = print_graph(g1)
    transform(g1)
    if print_graph(g1) != printed:
        return Outcome(False, "not idempotent: a second run changed the IR")
    try:
        out0, ref = interpret(g0, sh, seed, check_layouts=check_layouts)
        out1, _ = interpret(g1, sh, seed, check_layouts=check_layouts)
    except InterpError as exc:
        return Outcome(False, f"interpreter error: {exc}")
    err_pass, _ = compare(out1, out0, RTOL)
    err_ref, _ = compare(out1, ref, RTOL)
    if not (err_pass <= RTOL and err_ref <= RTOL):
        return Outcome(False, f"changed the result by {err_pass:.3g}, off the reference by {err_ref:.3g} "
                              f"({sh.describe()})")
    if torch.isnan(out1).any() or math.isinf(err_ref):
        return Outcome(False, "NaN in the output")
    return Outcome(True)
