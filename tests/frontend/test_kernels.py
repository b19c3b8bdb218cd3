"""Programs of several kernels (`Kernel NAME` lines, tlc/frontend/kernels.py, tlc/ir/module.py): the split into
one-kernel programs (each with the prologue's Params and the Inputs and global Allocates it names), the tensors'
roles (input, workspace, output), the refusals at their lines, the interpreter of the whole program, and
specs/split_kv_fwd.tl equal to attention over all the keys (an independent float64 reference)."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from tlc.api import check_source, compile_graph, compile_module, kernel_names
from tlc.diagnostics import TlcError
from tlc.frontend.format import format_program
from tlc.frontend.kernels import split_kernels
from tlc.frontend.parser import parse_text
from tlc.ir.module import run_module
from tlc.expr import Var
from tlc.testing.checks import Shapes
from tlc.testing.module_checks import check_module
from tests.frontend.lse_reference import attention_with_lse

SPEC = Path(__file__).resolve().parents[2] / "specs" / "split_kv_fwd.tl"
SMALL = {"HeadDim": "8", "BM": "4", "BN": "4"}


def test_the_kernels_and_what_each_names() -> None:
    sections = split_kernels(parse_text(SPEC.read_text(), "skv.tl"))
    assert [(k.name, k.program.axes) for k in sections] == [("partial", (("split_idx", Var("Splits")),)),
                                                           ("combine", ())]
    partial = format_program(sections[0].program)
    assert "Allocate O_part in global" in partial and "Allocate O in global" not in partial and "Kernel" not in partial
    combine = format_program(sections[1].program)
    assert "Input seqlen_q : int" in combine and "seqlen_k" not in combine and "Allocate Q in global" not in combine
    assert kernel_names(SPEC.read_bytes(), "skv.tl") == ["partial", "combine"]
    assert kernel_names((SPEC.parent / "mha_fwd.tl").read_bytes(), "mha.tl") == []


def test_the_roles_of_the_tensors() -> None:
    module, _ = compile_module(SPEC.read_text(), "skv.tl", defines=SMALL)
    assert module.roles() == {"Q": "input", "K": "input", "V": "input", "O_part": "workspace",
                              "LSE_part": "workspace", "O": "output", "LSE": "output"}


@pytest.mark.parametrize("splits", [1, 3, 4])
@pytest.mark.parametrize("sq, sk", [(1, 1), (5, 3), (9, 17), (4, 8), (13, 40), (2, 61)])
def test_split_kv_equals_attention_over_all_keys(sq: int, sk: int, splits: int) -> None:
    """Splits whose share of the key tiles is empty (sk ≤ BN · (splits − 1)) store O = 0, LSE = −inf: nothing."""
    module, _ = compile_module(SPEC.read_text(), "skv.tl", defines=dict(SMALL, Splits=str(splits)))
    g = torch.Generator().manual_seed(sq * 100 + sk)
    q, k, v = (torch.randn(2, 4 if n == "q" else 2, sq if n == "q" else sk, 8, generator=g, dtype=torch.float64)
               for n in "qkv")
    tensors = {"Q": q, "K": k, "V": v}
    for name, role in module.roles().items():
        if role != "input":
            heads = 4 * splits if name.endswith("_part") else 4
            rows = (2, heads, sq, 8) if name.startswith("O") else (2, heads, sq)
            tensors[name] = torch.full(rows, float("nan"), dtype=torch.float64)
    out = run_module(module, tensors, {"seqlen_q": sq, "seqlen_k": sk, "scale": 0.3})
    want = attention_with_lse(q, k, v, scale=0.3, causal=False, align="top_left")
    assert torch.allclose(out["O"], want["O"], atol=1e-12) and torch.allclose(out["LSE"], want["LSE"], atol=1e-12)


def test_the_passes_keep_the_programs_meaning() -> None:
    built, _ = compile_module(SPEC.read_text(), "skv.tl", defines=SMALL)
    written, _ = compile_module(SPEC.read_text(), "skv.tl", defines=SMALL, run_passes=False)
    for i, (sq, sk) in enumerate([(5, 3), (9, 17), (1, 40)]):
        r = check_module(built, written, Shapes(2, 4, 2, {"seqlen_q": sq, "seqlen_k": sk}, {"scale": 0.3}), seed=i)
        assert r.ok, r.describe()


def test_tlc_check_covers_every_kernel_on_both_targets() -> None:
    res = check_source(SPEC.read_text(), "skv.tl", targets=["sm_90", "sm_90a"])
    assert res.ok and all(t.error is None for t in res.targets), [t.error for t in res.targets]


def test_a_one_kernel_entry_point_names_the_kernels() -> None:
    with pytest.raises(TlcError, match=r"the program has 2 kernels \(partial, combine\)"):
        compile_graph(SPEC.read_text(), "skv.tl")
    graph, _ = compile_graph(SPEC.read_text(), "skv.tl", kernel="combine")
    assert set(graph.inputs) == {"seqlen_q"}
    with pytest.raises(TlcError, match="no kernel 'merge'; its kernels are partial, combine"):
        compile_graph(SPEC.read_text(), "skv.tl", kernel="merge")


PROLOGUE = """Param HeadDim = 8
Param BM = 4
Input seqlen_q : int
Allocate X in global (seqlen_q, HeadDim) as fp32
Allocate Y in global (seqlen_q, HeadDim) as fp32
Allocate Z in global (seqlen_q, HeadDim) as fp32
"""
COPY = """Copy {a} (BM, HeadDim) in coordinate [L = block_idx] from global to register
Compute Exp {a} and get {b}
Copy {b} (BM, HeadDim) in coordinate [L = block_idx] from register to global
"""


@pytest.mark.parametrize("text, line, words", [
    (PROLOGUE + "Copy X (BM, HeadDim) in coordinate [L = block_idx] from global to register\nKernel k\n"
     + COPY.format(a="X", b="Y"), 7, "this statement is in no kernel"),
    (PROLOGUE + "Kernel k\n" + COPY.format(a="X", b="Y") + "Param Extra = 3\n", 11,
     "a Param belongs to the whole program: move it above the first Kernel line (line 7)"),
    (PROLOGUE + "Kernel k\n" + COPY.format(a="X", b="Y") + "Kernel k\n" + COPY.format(a="Y", b="Z"), 11,
     "kernel 'k' is named twice"),
    (PROLOGUE + "Kernel k\nKernel j\n" + COPY.format(a="X", b="Y"), 7, "kernel 'k' has no statements"),
    (PROLOGUE + "Kernel k\nfor i = 0:2\nKernel j\nend\n" + COPY.format(a="X", b="Y"), 9,
     "'Kernel j' inside loop 'i'"),
    (PROLOGUE + "Kernel k\n" + COPY.format(a="X", b="Y") + "Kernel j\n" + COPY.format(a="X", b="Y"), 14,
     "'Y' is stored by kernel 'j' and by kernel 'k' before it"),
    (PROLOGUE + "Kernel k\n" + COPY.format(a="Y", b="Z") + "Kernel j\n" + COPY.format(a="X", b="Y"), 14,
     "'Y' is stored by kernel 'j' after an earlier kernel loads it"),
])
def test_what_a_program_of_kernels_cannot_be_is_refused_at_its_line(text: str, line: int, words: str) -> None:
    with pytest.raises(TlcError) as info:
        compile_module(text, "k.tl")
    messages = [f"{d.loc.line if d.loc else 0}: {d.message}" for d in info.value.diagnostics]
    assert any(m.startswith(f"{line}: ") and words in m for m in messages), messages


def test_a_two_kernel_chain_runs_in_order() -> None:
    module, _ = compile_module(PROLOGUE + "Kernel k\n" + COPY.format(a="X", b="Y") + "Kernel j\n"
                               + COPY.format(a="Y", b="Z"), "k.tl")
    assert module.roles() == {"X": "input", "Y": "workspace", "Z": "output"}
    x = torch.randn(1, 1, 6, 8, dtype=torch.float64) / 4
    nan = torch.full((1, 1, 6, 8), float("nan"), dtype=torch.float64)
    out = run_module(module, {"X": x, "Y": nan, "Z": nan.clone()}, {"seqlen_q": 6})
    assert torch.allclose(out["Z"], torch.exp(torch.exp(x)))
    assert math.isfinite(float(out["Z"].sum()))


def test_a_kernel_loading_what_it_stores_is_refused() -> None:
    """Found by review: its blocks would read what others have or have not written (a plain store read from
    torch.empty, an add read while others add)."""
    text = PROLOGUE + "Kernel k\n" + COPY.format(a="X", b="Y") + \
        "Copy Y (BM, HeadDim) in coordinate [L = block_idx] from global to register\n" \
        "Compute Exp Y and get Z\nCopy Z (BM, HeadDim) in coordinate [L = block_idx] from register to global\n"
    with pytest.raises(TlcError, match="'Y' is loaded by the kernel that stores it"):
        compile_module(text, "k.tl")


def test_a_kernel_line_takes_no_when() -> None:
    text = SPEC.read_text().replace("Kernel combine", "Kernel combine when Nothing")
    with pytest.raises(TlcError, match="'Kernel combine' takes no 'when'"):
        compile_module(text, "skv.tl", defines=SMALL)


def test_a_kernel_takes_the_global_tensors_it_copies_and_the_inputs_it_reads() -> None:
    """Found by review: every word of a kernel's statements was taken for a name, so a global tensor named like a
    coordinate key or a local tile (`L`, `S`) joined kernels that do not copy it and was refused there; an Input
    only a tensor Input's dimension named was dropped."""
    text = SPEC.read_text().replace("LSE_part", "L").replace("Allocate O in global", "Allocate S in global (seqlen_q) "
                                                                              "as fp32\nAllocate O in global")
    text = text.replace("Copy LSE (BM) in coordinate [L = block_idx] from register to global",
                        "Copy LSE (BM) in coordinate [L = block_idx] from register to global\n"
                        "Compute Add log_l, 0 and get S\nCopy S (BM) in coordinate [L = block_idx] from register to global")
    module, _ = compile_module(text, "skv.tl", defines=SMALL)
    assert module.roles()["L"] == "workspace" and module.roles()["S"] == "output"
    nb = PROLOGUE.replace("Input seqlen_q : int", "Input seqlen_q, nb : int\nInput lens : int32[nb]").replace(
        "Allocate X in global (seqlen_q, HeadDim)", "Allocate X in global (min(lens[batch_idx], seqlen_q), HeadDim)").replace(
        "Allocate Y in global (seqlen_q, HeadDim)", "Allocate Y in global (min(lens[batch_idx], seqlen_q), HeadDim)") + \
        "Kernel k\n" + COPY.format(a="X", b="Y")
    assert "nb" in dict(compile_module(nb, "k.tl")[0].kernels)["k"].inputs


def test_kernel_names_of_a_program_without_kernel_lines_parses_nothing(monkeypatch) -> None:
    """A warm start looks its kernel up without building lark's parser: no line starts with `Kernel`, no parse
    (a `# Kernel` comment or `Kernel` inside a line is no kernel line); a program with one is parsed."""
    import tlc.api as api
    from tlc.attention.kernels import specs_dir

    monkeypatch.setattr(api, "parse_text", lambda *a: pytest.fail("parsed a program without Kernel lines"))
    text = (specs_dir() / "gqa_fwd.tl").read_text()
    assert api.kernel_names(text + "\n# Kernel combine: a comment\n", "g.tl") == []
    assert api.kernel_names(text.encode(), "g.tl") == []
    monkeypatch.undo()
    assert api.kernel_names((specs_dir() / "decode_fwd.tl").read_bytes(), "d.tl") == ["partial", "combine"]
