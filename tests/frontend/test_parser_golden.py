"""Golden tests of the parser: the AST and the source spans of the paper's spellings."""
from __future__ import annotations

from tlc.diagnostics import Loc
from tlc.frontend import ast as A
from tlc.frontend.parser import parse_text

LOOP_END = """\
Param BN = 4
Input seqlen_k : int
Allocate S in register (BN, BN)
for n = 0:seqlen_k / BN
  Compute Exp S and get new S
  for m = 0:2
    Compute Relu S and get new S
  end
end
"""

LOOP_INDENTED = """\
Param BN = 4
Input seqlen_k : int
Allocate S in register (BN, BN)
for n in 0:seqlen_k / BN:
  Compute Exp S and get new S
  for m in 0:2:
    Compute Relu S and get new S
"""


def strip_style(stmts):
    """Statements with the `indented` spelling flag cleared (it records how, not what)."""
    out = []
    for s in stmts:
        if isinstance(s, A.ForStmt):
            s = A.ForStmt(s.var, s.start, s.stop, tuple(strip_style(s.body)), False, when=s.when)
        out.append(s)
    return out


def test_both_loop_spellings_give_the_same_program() -> None:
    a, b = parse_text(LOOP_END), parse_text(LOOP_INDENTED)
    assert strip_style(a.body) == strip_style(b.body)
    loop = a.body[3]
    assert isinstance(loop, A.ForStmt) and loop.var == "n" and str(loop.stop) == "seqlen_k / BN"
    assert [type(s).__name__ for s in loop.body] == ["ComputeStmt", "ForStmt"]
    assert b.body[3].indented and not a.body[3].indented


def test_spans_point_at_the_statement_and_its_parts() -> None:
    prog = parse_text("Param BM = 4\n\n   Allocate Q in shmem (BM, 8) with offset head_idx\n", "s.tl")
    alloc = prog.body[1]
    assert isinstance(alloc, A.AllocateStmt)
    assert alloc.loc == Loc("s.tl", 3, 4, alloc.loc.end_col) and alloc.loc.end_col > 40
    assert (alloc.name_loc.line, alloc.name_loc.col, alloc.name_loc.end_col) == (3, 13, 14)
    assert (alloc.space_loc.col, alloc.space_loc.end_col) == (18, 23)


def test_loop_header_span_uses_its_indentation() -> None:
    prog = parse_text("Allocate S in register (4, 4)\nfor n in 0:2:\n    for m in 0:2:\n        Compute Exp S and get new S\n")
    inner = prog.body[1].body[0]
    assert (inner.loc.line, inner.loc.col) == (3, 5)


def test_gemm_operands_and_modes() -> None:
    prog = parse_text("Compute GEMM Q, K.T and get S\nCompute gemm P, V and ACCUMULATE O\n")
    g1, g2 = prog.body
    assert (str(g1.a), str(g1.b), g1.accumulate, g1.out) == ("Q", "K.T", False, "S")
    assert (str(g2.a), str(g2.b), g2.accumulate, g2.out) == ("P", "V", True, "O")
    assert (g1.b.loc.col, g1.b.loc.end_col) == (17, 18)


def test_keywords_are_case_insensitive() -> None:
    paper = parse_text("Allocate S in register (4, 4)\nCompute Softmax S with max m, sum l and get P\n")
    loud = parse_text("ALLOCATE S IN REGISTER (4, 4)\nCOMPUTE SOFTMAX S WITH MAX m, SUM l AND GET P\n")
    quiet = parse_text("allocate S in register (4, 4)\ncompute softmax S with max m, sum l and get P\n")
    assert paper.body[1] == loud.body[1] == quiet.body[1]
    assert paper.body[1] == A.SoftmaxStmt("S", "m", "l", "P")


def test_names_stay_case_sensitive() -> None:
    prog = parse_text("Param Causal = true\nAllocate S in register (4, 4) when Causal\n")
    assert prog.body[1].when == "Causal"


def test_comments_blank_lines_and_trailing_space_are_ignored() -> None:
    plain = parse_text("Param BM = 4\nAllocate S in register (BM, BM)\n")
    noisy = parse_text("# header\n\nParam BM = 4   # the tile\n\t\n   \nAllocate S in register (BM, BM)  \t\n\n# end\n")
    assert plain.body == noisy.body


def test_copy_with_tile_and_coordinates() -> None:
    prog = parse_text("Copy K (BN, D) in coordinate [L = n + 1, C = 0] from global to shared\n")
    c = prog.body[0]
    assert isinstance(c, A.CopyStmt)
    assert [str(d) for d in c.tile] == ["BN", "D"]
    assert [(k, str(e)) for k, e in c.coord] == [("L", "n + 1"), ("C", "0")]
    assert (c.src, c.dst) == ("global", "shared")


def test_expressions_keep_precedence() -> None:
    prog = parse_text("Allocate K in global (a - b - c, a / (b * c)) with offset head_idx / group\n")
    alloc = prog.body[0]
    assert [str(d) for d in alloc.shape] == ["a - b - c", "a / (b * c)"]
    assert str(alloc.offset) == "head_idx / group"


def test_reshape_mask_param_input() -> None:
    prog = parse_text("Param Causal = true\nParam Softcap = 30.0\nInput seqlen_q, seqlen_k : int\n"
                      "Compute Mask S causal bottom_right and get new S when Causal\n"
                      "Reshape P from (MMA_C, MMA_M, MMA_N) to (MMA_A, MMA_M, MMA_N) as bf16\n")
    p, sc, inp, mask, rs = prog.body
    assert (p.value, sc.value) == ("true", 30.0)
    assert inp.names == ("seqlen_q", "seqlen_k") and inp.kind == "int"
    assert (mask.alignment, mask.new, mask.when) == ("bottom_right", True, "Causal")
    assert (rs.src_modes[0], rs.dst_modes[0], rs.dtype) == ("MMA_C", "MMA_A", "bf16")


def test_bytes_with_bom_and_crlf() -> None:
    prog = parse_text("\ufeffParam BM = 4\r\nAllocate S in register (BM, BM)\r\n".encode())
    assert len(prog.body) == 2
