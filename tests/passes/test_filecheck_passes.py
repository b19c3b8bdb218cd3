"""Golden pass tests: tests/filecheck/passes/*.tl, run in process with the `filecheck`
package (as Triton does) instead of spawning `tlc` and `filecheck` per case.

A file holds cases separated by a line `# -----` (mlir-opt's --split-input-file); each
case is compiled on its own, with the line numbers it has in the whole file, and the
outputs are joined by `// -----`. The RUN line is a real shell command:

    # RUN: tlc show %s --pipeline verify,infer-shapes --print-after infer-shapes 2>&1 | filecheck %s

understood here as: `--pipeline`, `--print-after` (repeatable), `--no-locs`, `-D NAME=VALUE`
and filecheck's `--check-prefix`. Output is what `tlc show` prints: the IR after the
named passes, then remarks; or, when the pipeline fails, the rendered errors. A case
whose first line is `tl.program "f.tl"` is IR text (Triton's IRSource idea), for
structures the frontend would refuse to build.
"""
from __future__ import annotations

import io
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from filecheck.finput import FInput
from filecheck.matcher import Matcher
from filecheck.options import Options
from filecheck.parser import Parser

from tlc.diagnostics import GLOBAL_SOURCES, TlcError
from tlc.frontend.lower import lower_program
from tlc.frontend.parser import parse_text
from tlc.ir.graph import Graph
from tlc.ir.irparser import parse_ir
from tlc.passes.base import PassContext
from tlc.passes.pipeline import run_pipeline

ROOT = Path(__file__).resolve().parents[2]
CASES = sorted((ROOT / "tests" / "filecheck" / "passes").glob("*.tl"))
SEPARATOR = re.compile(r"^# -----\s*$", re.M)


@dataclass
class RunLine:
    pipeline: str = ""
    print_after: list[str] = field(default_factory=list)
    defines: dict[str, str] = field(default_factory=dict)
    with_locs: bool = True
    check_prefix: str = "CHECK"


def parse_run(text: str) -> RunLine:
    lines = [m.group(1) for m in re.finditer(r"^#\s*RUN:\s*(.*)$", text, re.M)]
    if len(lines) != 1:
        raise ValueError(f"expected exactly one RUN line, found {len(lines)}")
    tool, _, check = lines[0].partition("|")
    words = shlex.split(tool.replace("2>&1", ""))
    if words[:2] != ["tlc", "show"]:
        raise ValueError(f"RUN line must start with 'tlc show', not {words[:2]}")
    run = RunLine()
    it = iter(words[2:])
    for w in it:
        if w == "--pipeline":
            run.pipeline = next(it)
        elif w == "--print-after":
            run.print_after.append(next(it))
        elif w == "--no-locs":
            run.with_locs = False
        elif w == "-D":
            key, _, value = next(it).partition("=")
            run.defines[key] = value
        elif w != "%s":
            raise ValueError(f"unsupported RUN option {w!r}")
    cwords = shlex.split(check)
    if "--check-prefix" in cwords:
        run.check_prefix = cwords[cwords.index("--check-prefix") + 1]
    return run


def compile_case(source: str, file: str, run: RunLine) -> str:
    """What `tlc show FILE --pipeline … --print-after …` prints for one case."""
    out = io.StringIO()
    ctx = PassContext()
    try:
        graph = _load(source, file, run)
        run_pipeline(graph, run.pipeline, ctx=ctx, print_after=set(run.print_after), out=out)
    except TlcError as exc:
        return out.getvalue() + exc.render() + "\n"
    remarks = [d.render() for d in ctx.sink.items if d.severity != "error"]
    return out.getvalue() + "".join(r + "\n" for r in remarks)


def _load(source: str, file: str, run: RunLine) -> Graph:
    """TL source, or (a case starting with `tl.program`) canonical IR text, whose
    `loc(line:col)` annotations then stand for the `.tl` lines."""
    lines = [ln for ln in source.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if lines and lines[0].startswith("tl.program"):
        return parse_ir("\n".join(lines))
    GLOBAL_SOURCES.add(file, source)
    return lower_program(parse_text(source, file), defines=run.defines)


def compile_file(path: Path) -> tuple[RunLine, str]:
    text = path.read_text()
    run = parse_run(text)
    outputs, offset = [], 0
    for chunk in SEPARATOR.split(text):
        padded = "\n" * offset + chunk  # keep the line numbers the case has in the file
        offset += chunk.count("\n")
        if re.search(r"^\s*[A-Za-z]", chunk, re.M):
            outputs.append(compile_case(padded, path.name, run))
    return run, "// -----\n".join(outputs)


def filecheck(check_file: Path, output: str, prefix: str = "CHECK") -> int:
    opts = Options(match_filename=str(check_file), check_prefixes=prefix)
    matcher = Matcher(opts, FInput("<tlc output>", FInput.canonicalize_line_ends(output)), Parser.from_opts(opts))
    return matcher.run()


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.name)
def test_golden(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run, output = compile_file(path)
    rc = filecheck(path, output, run.check_prefix)
    report = capsys.readouterr()
    assert rc == 0, f"FileCheck failed on {path.name}:\n{report.out}{report.err}\n--- output ---\n{output}"


def test_golden_files_exist() -> None:
    names = {p.stem for p in CASES}
    assert {"verify", "infer_shapes", "resolve_transpose", "insert_reshape", "verify_final"} <= names


def test_filecheck_can_fail(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The harness itself must be able to fail: a CHECK that the output lacks."""
    f = tmp_path / "bad.tl"
    f.write_text("# CHECK: no such line\n")
    assert filecheck(f, "some other output\n") != 0
    capsys.readouterr()
