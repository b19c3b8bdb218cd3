"""Emitter goldens (tests/filecheck/emit, FileCheck in process) and emitter invariants."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from filecheck.finput import FInput
from filecheck.matcher import Matcher
from filecheck.options import Options
from filecheck.parser import Parser

from tlc.backend_cute.emit import emit_program
from tlc.diagnostics import Loc, TlcError
from tests.lowering.programs import SPECS, attention_kir
from tlc.lowering.emit_text import kernel_ir
from tlc.kir.ops import BarrierOp, KernelOp, ProgramOp
from tlc.kir.text import parse_kir

ROOT = Path(__file__).resolve().parents[2]
GOLDENS = sorted((ROOT / "tests" / "filecheck" / "emit").glob("*.kirtest"))
SEPARATOR = re.compile(r"^// -----\s*$", re.M)


def emit_case(case: str) -> str:
    spec = re.search(r"^// TL: (\S+)(.*)$", case, re.M)
    if spec:
        defines = dict(kv.split("=", 1) for kv in spec.group(2).split())
        program = kernel_ir(SPECS / spec.group(1), "sm_90", defines)
    else:
        kir = "\n".join(m.group(1) for m in re.finditer(r"^// KIR: ?(.*)$", case, re.M))
        program = parse_kir(kir[kir.index("ProgramOp("):])
    return emit_program(program, line_directives=False)


def filecheck(check_text: str, output: str, tmp_path: Path) -> int:
    check_file = tmp_path / "case.check"
    check_file.write_text(check_text)
    opts = Options(match_filename=str(check_file), check_prefixes=["CHECK"])
    return Matcher(opts, FInput("<emitted>", FInput.canonicalize_line_ends(output)), Parser.from_opts(opts)).run()


@pytest.mark.parametrize("path", GOLDENS, ids=lambda p: p.name)
def test_emit_goldens(path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    run = path.read_text().splitlines()[0]
    if "TLC_FOLD_PARTITIONS=0" in run:   # the RUN line's environment
        monkeypatch.setenv("TLC_FOLD_PARTITIONS", "0")
    for i, case in enumerate(SEPARATOR.split(path.read_text())):
        if "CHECK" not in case:
            continue
        output = emit_case(case)
        rc = filecheck(case, output, tmp_path)
        report = capsys.readouterr()
        assert rc == 0, f"{path.name} case {i}:\n{report.out}{report.err}"


def test_filecheck_harness_can_fail(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert filecheck("// CHECK: no such line\n", "other\n", tmp_path) != 0
    capsys.readouterr()


def _mma_and_layouts(src: str) -> list[str]:
    return [ln.strip() for ln in src.splitlines() if "TiledMMA<" in ln or "tile_to_shape(" in ln or "make_tiled_copy(" in ln]


@pytest.mark.parametrize("change", [dict(bm=64), dict(bn=32), dict(warps=8), dict(stages=2)],
                         ids=lambda c: next(iter(c)))
def test_tile_parameters_change_emitted_mma_and_layouts(change, monkeypatch):
    """Tiles live in the kernel IR: each knob changes the TiledMMA or the layouts (CuTe's partitions;
    folded, the whole source changes too)."""
    base = dict(d=128, bm=128, bn=64, warps=4, stages=1)
    folded = [emit_program(attention_kir(**kw), line_directives=False) for kw in (base, {**base, **change})]
    assert folded[0] != folded[1]
    monkeypatch.setenv("TLC_FOLD_PARTITIONS", "0")
    a = emit_program(attention_kir(**base), line_directives=False)
    b = emit_program(attention_kir(**{**base, **change}), line_directives=False)
    assert _mma_and_layouts(a) != _mma_and_layouts(b)
    if "warps" in change:
        assert "Layout<Shape<Int<8>, Int<1>, Int<1>>>, Tile<Int<128>" in b
    if "stages" in change:
        assert "Shape<Int<64>, Int<128>, Int<2>>" in b and "cp_async_wait<1>();" in b


def test_emitter_is_deterministic():
    assert emit_program(attention_kir(causal=True)) == emit_program(attention_kir(causal=True))


def test_line_directives_use_basename_and_escape():
    import dataclasses
    program = attention_kir()
    kernel = program.kernels()[0]
    odd = dataclasses.replace(kernel.body[0], loc=Loc('/some/dir/we"ird.tl', 12, 3))
    program = dataclasses.replace(program, body=(program.body[0], dataclasses.replace(
        kernel, body=(odd,) + kernel.body[1:])))
    src = emit_program(program, line_directives=True)
    assert '#line 12 "we_ird.tl"' in src
    assert "/some/dir" not in src
    assert "#line" not in emit_program(program, line_directives=False)


def test_refuses_non_kernel_ir_ops():
    program = attention_kir()

    class NotAnOp:
        loc = None

    kernel = program.kernels()[0]
    bad = ProgramOp(name="p", body=(program.body[0], KernelOp(name="k", params=program.body[0].name, threads=128, min_blocks=1,
                                             grid=kernel.grid, smem_bytes=0, body=(BarrierOp(),)),))
    from tlc.backend_cute.emit import CuteEmitter
    with pytest.raises(TlcError, match="not a kernel-IR op"):
        CuteEmitter().emit(NotAnOp())
    with pytest.raises(TlcError, match="ProgramOp"):
        emit_program(kernel)  # a kernel alone is not a program
    assert "__syncthreads();" in emit_program(bad)


def test_unsafe_identifiers_never_reach_cpp():
    from tlc.kir.expr import E, Var
    from tlc.kir.ops import LetOp, TiledCopyOp
    with pytest.raises(TlcError, match="invalid"):
        LetOp(name="x; system(1)", type="i32", value=E(0)).verify()
    with pytest.raises(TlcError, match="keyword"):
        Var("int")
    with pytest.raises(TlcError):
        E("a; b")
    with pytest.raises(TlcError, match="unknown copy atom"):
        TiledCopyOp(name="c", atom="evil<>", dtype="bf16", kind="A", mma="m", thread_slice="t").verify()


def test_names_must_be_defined_before_use():
    """A lowering bug is reported at the op's .tl line, not as a C++ error from NVRTC."""
    import dataclasses

    from tlc.kir.expr import E
    from tlc.kir.ops import MapOp
    program = attention_kir()
    kernel = program.kernels()[0]
    stray = MapOp(target="rO", srcs=("no_such_tensor",), fn=E("x0"), loc=Loc("mha.tl", 21, 3))
    broken = dataclasses.replace(program, body=(program.body[0], dataclasses.replace(
        kernel, body=kernel.body[:3] + (stray,) + kernel.body[3:])))
    with pytest.raises(TlcError) as exc:
        emit_program(broken)
    diag = exc.value.diagnostics[0]
    assert "no_such_tensor" in diag.message and diag.loc.line == 21
