"""TL's `%` in the kernel: `floor_mod` reaches the emitted C++ as `tlc::floor_mod`, whose definition
every emitted source carries; the C++ helper, the host evaluator and the tile evaluator all floor
(the helper is checked with the host C++ compiler, no NVRTC)."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from tlc.backend_cute.cpp import cpp_expr
from tlc.expr import parse_expr
from tlc.kir.evaluate import evaluate
from tlc.kir.tile_eval_expr import eval_tensor_expr
from tlc.lowering.emit_text import emit_text

ROOT = Path(__file__).resolve().parents[2]
PREAMBLE = ROOT / "tlc" / "backend_cute" / "templates" / "preamble.cuh"
GQA = ROOT / "specs" / "gqa_fwd.tl"
GRID = range(-9, 10)


def _gqa_with_offset(offset: str) -> str:
    text = GQA.read_text()
    assert text.count("with offset head_idx / group") == 2
    return emit_text(text.replace("with offset head_idx / group", f"with offset {offset}").encode(), "gqa_fwd.tl",
                     "sm_90", {}, "cute", line_directives=False)


def test_a_possibly_negative_modulo_emits_the_helper_call() -> None:
    src = _gqa_with_offset("(head_idx - group) % group")
    assert src.count("tlc::floor_mod(head_idx - group, group)") == 2
    assert "CUTE_HOST_DEVICE constexpr int floor_mod(int a, int b)" in src  # defined in the same source
    assert src.index("constexpr int floor_mod(") < src.index("tlc::floor_mod(head_idx - group, group)")


def test_a_provably_non_negative_modulo_stays_cpp_s() -> None:
    src = _gqa_with_offset("head_idx % group")
    assert "tlc::floor_mod(" not in src and src.count("head_idx % group") == 2


def test_cpp_spelling() -> None:
    assert cpp_expr(parse_expr("floor_mod(n - 1, 2) + 1")) == "tlc::floor_mod(n - 1, 2) + 1"


def test_the_evaluators_floor() -> None:
    for a in GRID:
        for b in (-3, -2, 2, 3):
            assert evaluate(parse_expr(f"floor_mod({a}, {b})"), {}) == a % b
            assert evaluate(parse_expr("floor_mod(a, b)"), {"a": a, "b": b}) == a % b
    x = torch.tensor([float(a) for a in GRID], dtype=torch.float64)
    for b in (-3, 3):
        got = eval_tensor_expr(parse_expr(f"floor_mod(x, {b})"), {"x": x}, {})
        assert got.tolist() == [float(a % b) for a in GRID]
    # a subexpression over scalars only goes through the host evaluator
    assert eval_tensor_expr(parse_expr("x + floor_mod(k, 3)"), {"x": x}, {"k": -4}).tolist() == \
        [a + 2.0 for a in GRID]


def _helper_line(name: str = "floor_mod") -> str:
    (line,) = [ln for ln in PREAMBLE.read_text().splitlines() if re.search(rf"\bint {name}\(", ln)]
    return line


@pytest.mark.skipif(shutil.which("g++") is None, reason="no host C++ compiler")
def test_the_cpp_division_helpers_floor_and_ceil_like_python(tmp_path: Path) -> None:
    """tlc::floor_div / ceil_div for every sign of both operands (a negative divisor included)."""
    pairs = [(a, b) for a in GRID for b in (-4, -3, -1, 1, 3, 4)]
    program = "\n".join([
        "#include <cstdio>", "#define CUTE_HOST_DEVICE", "namespace tlc {", _helper_line("floor_div"),
        _helper_line("ceil_div"), "}", "int main() {",
        *(f'  std::printf("%d %d\\n", tlc::floor_div({a}, {b}), tlc::ceil_div({a}, {b}));' for a, b in pairs),
        "}", ""])
    (tmp_path / "d.cpp").write_text(program)
    subprocess.run(["g++", "-std=c++17", "-Wall", "-Werror", "-o", str(tmp_path / "d"), str(tmp_path / "d.cpp")],
                   check=True, capture_output=True, text=True)
    out = subprocess.run([str(tmp_path / "d")], check=True, capture_output=True, text=True).stdout.split()
    assert [int(v) for v in out] == [x for a, b in pairs for x in (a // b, -(-a // b))]


@pytest.mark.skipif(shutil.which("g++") is None, reason="no host C++ compiler")
def test_the_cpp_helper_floors_like_python(tmp_path: Path) -> None:
    pairs = [(a, b) for a in GRID for b in (-4, -3, -1, 1, 3, 4)]
    program = "\n".join([
        "#include <cstdio>", "#define CUTE_HOST_DEVICE", "namespace tlc {", _helper_line(), "}",
        "static_assert(tlc::floor_mod(-7, 2) == 1 && tlc::floor_mod(7, -2) == -1, \"constexpr\");",
        "int main() {",
        *(f'  std::printf("%d\\n", tlc::floor_mod({a}, {b}));' for a, b in pairs),
        "}", ""])
    (tmp_path / "m.cpp").write_text(program)
    subprocess.run(["g++", "-std=c++17", "-Wall", "-Werror", "-o", str(tmp_path / "m"), str(tmp_path / "m.cpp")],
                   check=True, capture_output=True, text=True)
    out = subprocess.run([str(tmp_path / "m")], check=True, capture_output=True, text=True).stdout.split()
    assert [int(v) for v in out] == [a % b for a, b in pairs]
