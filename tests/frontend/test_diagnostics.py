"""Malformed programs and the exact diagnostic each gets: `line:col` and what the message
must say (what was expected, in words an LLM can act on)."""
from __future__ import annotations

import pytest

from tlc.diagnostics import TlcError
from tlc.frontend.parser import parse_text

R = "Allocate S in register (4, 4)\n"
SQ = "Allocate Q in shared (4, 4)\n"

# name: (source, "line:col" of the first error, substring of its message)
MALFORMED = {
    "empty": ("", "1:1", "the program is empty"),
    "comments-only": ("# nothing\n\n", "1:1", "the program is empty"),
    "unknown-statement": ("Allocat Q in global (4, 4)\n", "1:1", "unknown statement 'Allocat'"),
    "caret-transpose": (SQ + "Compute GEMM Q, Q^T and get S\n", "2:18", "write a transpose as '.T'"),
    "dot-suffix": (SQ + "Compute GEMM Q, Q.x and get S\n", "2:18", "only '.T' (transpose) may follow"),
    "gemm-without-mode": ("Compute GEMM Q, K and S\n", "1:23", "expected 'get' or 'accumulate'"),
    "compute-without-result": ("Compute Exp S\n", "1:13", "and get [new] NAME"),
    "copy-without-from": ("Copy Q global to shared\n", "1:8", "from SPACE to SPACE"),
    "unclosed-paren": ("Allocate S in register (4, 4\n", "1:28", "expected ')' or ','"),
    "missing-space": ("Allocate S (4, 4)\n", "1:12", "expected 'in'"),
    "stray-character": ("Allocate S in register (4, 4) $\n", "1:31", "unexpected character '$'"),
    "end-without-for": ("end\n", "1:1", "'end' without an open loop"),
    "for-never-closed": ("for n = 0:4\n  Compute Exp S and get S\n", "1:1", "never closed; add 'end'"),
    "indented-empty-body": ("for n in 0:4:\nParam BM = 3\n", "1:1", "empty body"),
    "bad-dedent": ("for n in 0:4:\n    " + R + "  Compute Exp S and get new S\n", "3:1",
                   "indentation does not match"),
    "tabs-and-spaces": ("for n in 0:4:\n \t" + R, "2:1", "mixes tabs and spaces"),
    "when-on-loop": ("Param C = true\nfor n = 0:4 when C\nend\n", "2:18", "'when' cannot guard a loop"),
    "undefined-tile": ("Compute Exp S and get T\n", "1:13", "undefined tile 'S'"),
    "undefined-name-in-shape": ("Allocate S in register (BM, 4)\n", "1:1", "undefined name 'BM'"),
    "undefined-name-suggests": ("Param HeadDim = 8\nAllocate S in register (HeadDm, 4)\n", "2:1",
                                "did you mean 'HeadDim'"),
    "duplicate-param": ("Param BM = 4\nParam BM = 8\n", "2:1", "parameter 'BM' is defined twice"),
    "duplicate-allocation": (R + R, "2:10", "'S' is already allocated in register"),
    "duplicate-input": ("Input n : int\nInput n : int\n", "2:1", "'n' is already declared"),
    "unknown-space-hint": ("Allocate S in smem (4, 4)\n", "1:15", "did you mean 'shared'"),
    "unknown-space": ("Allocate S in texture (4, 4)\n", "1:15", "unknown memory space 'texture'"),
    "copy-unknown-space": ("Allocate Q in global (4, 4)\nCopy Q (4, 4) in coordinate [L = 0] from global to gpu\n",
                           "2:52", "unknown memory space 'gpu'"),
    "arity-too-many": (R + "Compute Exp S, S and get T\n", "2:1", "'Exp' takes 1 argument, got 2"),
    "arity-too-few": (R + "Compute Add S and get T\n", "2:1", "'Add' takes 2 arguments, got 1"),
    "open-param": ("Param BM\nAllocate S in register (BM, 4)\n", "1:1", "parameter 'BM' has no value"),
    "cpp-keyword": ("Allocate int in register (4, 4)\n", "1:10", "C++ keyword"),
    "cpp-double-underscore": ("Allocate __x in register (4, 4)\n", "1:10", "reserved in C++"),
    "cpp-underscore-capital": ("Allocate _X in register (4, 4)\n", "1:10", "reserved in C++"),
    "cpp-inner-dunder": ("Allocate a__b in register (4, 4)\n", "1:10", "contains '__'"),
    "cpp-name-used-by-codegen": ("Param cute = 1\n", "1:1", "C++ keyword or a name the generated code uses"),
    "unknown-operation": (R + "Compute Sigmoid S and get T\n", "2:9", "unknown operation 'Sigmoid'"),
    "bad-alignment": (R + "Compute Mask S causal middle and get new S\n", "2:23", "top_left (as SDPA)"),
    "copy-same-space": (R + "Copy S from register to register\n", "2:1", "the spaces must differ"),
    "copy-not-allocated": ("Copy Q (4, 4) in coordinate [L = 0] from global to shared\n", "1:6",
                           "add 'Allocate Q in global"),
    "gemm-from-global": ("Allocate Q in global (4, 4)\nCompute GEMM Q, Q.T and get S\n", "2:14",
                         "copy it to shared first"),
    "accumulate-undefined": ("Allocate Q in register (4, 4)\nCompute GEMM Q, Q.T and accumulate O\n", "2:36",
                             "needs an existing accumulator"),
    "get-new-undefined": ("Allocate Q in register (4, 4)\nCompute Exp Q and get new Z\n", "2:1",
                          "'get new Z' replaces 'Z', which is not defined"),
    "reshape-bad-layout": (R + "Reshape S from (MMA_X, MMA_M) to (MMA_A, MMA_M)\n", "2:1",
                           "starts with MMA_A, MMA_B or MMA_C"),
    "unknown-dtype": ("Allocate S in shared (4, 4) as int8\n", "1:1", "unknown element type 'int8'"),
    "loop-var-shadows": ("Param BM = 4\nfor BM = 0:4\n  " + R + "end\n", "2:1", "shadows a parameter"),
    "input-kind": ("Input x : double\n", "1:1", "input type must be int or float"),
    "offset-on-shared": ("Allocate S in shared (4, 4) with offset head_idx\n", "1:1", "remove it from a shared"),
    "coordinate-without-tile": ("Allocate Q in global (4, 4)\nCopy Q in coordinate [L = 0] from global to shared\n",
                                "2:1", "a coordinate needs a tile shape"),
    "unknown-coordinate": ("Allocate Q in global (4, 4)\nCopy Q (4, 4) in coordinate [Z = 0] from global to shared\n",
                           "2:1", "unknown coordinate 'Z'"),
    "unknown-function": ("Allocate S in register (foo(4), 4)\n", "1:25", "unknown function 'foo'"),
    "param-named-builtin": ("Param head_idx = 3\n", "1:1", "built-in runtime index"),
    "when-undefined": ("Allocate S in register (4, 4) when Nope\n", "1:1", "no boolean 'Param Nope'"),
    "when-not-boolean": ("Param X = 4\nAllocate S in register (4, 4) when X\n", "2:1", "needs a true/false parameter"),
    "store-not-allocated": (R + "Copy S (4, 4) in coordinate [L = 0] from register to global\n", "2:6",
                            "never allocated there"),
    "tile-as-scalar": (R + "Allocate T in register (S, 4)\n", "2:1", "'S' is a tile"),
}


def first_error(source: str) -> tuple[str, str]:
    from tlc.frontend.lower import lower_program

    with pytest.raises(TlcError) as info:
        lower_program(parse_text(source, "bad.tl"))
    d = info.value.diagnostics[0]
    assert d.severity == "error" and d.loc is not None and d.loc.file == "bad.tl"
    return f"{d.loc.line}:{d.loc.col}", d.message


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_program_diagnostic(name: str) -> None:
    source, where, text = MALFORMED[name]
    got_where, message = first_error(source)
    assert (got_where, text in message) == (where, True), f"{got_where}: {message}"


def test_there_are_at_least_thirty_cases() -> None:
    assert len(MALFORMED) >= 30


def test_rendered_form_has_source_line_and_caret() -> None:
    with pytest.raises(TlcError) as info:
        parse_text("Param BM = 4\nAllocate S in smem (4, 4) $\n", "r.tl")
    text = info.value.render()
    assert text.splitlines()[:3] == ["r.tl:2:27: error: unexpected character '$'",
                                     "Allocate S in smem (4, 4) $", " " * 26 + "^"]


def test_several_errors_are_collected(diags) -> None:
    got = diags("Allocat S\nAllocate S in smem (4, 4)\nCompute Exp T and get U\nend\n")
    assert [g.split(":")[0] for g in got] == ["1", "4"]  # syntax errors of every line first, then stop
    got = diags("Allocate S in smem (4, 4)\nCompute Exp T and get U\nParam BM\n")
    assert len(got) == 3, got


def test_open_params_are_fine_in_sketch_mode(diags) -> None:
    assert diags("Param BM\nAllocate S in register (BM, 4)\n", sketch=True) == []
    assert diags("Param BM\nAllocate S in register (BM, 4)\n", defines={"BM": "8"}) == []


def test_unknown_define_is_reported(diags) -> None:
    got = diags("Param BM = 4\n" + R, defines={"BN": "8"})
    assert any("-D BN" in g and "no 'Param BN'" in g for g in got), got
