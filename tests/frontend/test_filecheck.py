"""FileCheck goldens for the frontend: tests/filecheck/{frontend,diagnostics}/*.tl, run in
process with the `filecheck` package.

A file holds cases separated by a line `# -----`; each case keeps the line numbers it has
in the whole file (earlier lines become blank) and is checked against its own CHECK
lines. One RUN line per file, a real command:

    # RUN: tlc check %s 2>&1 | filecheck %s          rendered diagnostics ("ok" if none)
    # RUN: tlc show %s --no-locs -D N=V | filecheck %s   the lowered TL graph (no passes)
    # RUN: tlc fmt %s | filecheck %s                 the canonical TL text
"""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from filecheck.finput import FInput
from filecheck.matcher import Matcher
from filecheck.options import Options
from filecheck.parser import Parser

from tlc.diagnostics import GLOBAL_SOURCES, TlcError
from tlc.frontend.lower import lower_program
from tlc.frontend.parser import parse_text
from tlc.ir.printer import print_graph

ROOT = Path(__file__).resolve().parents[2]
CASES = sorted((ROOT / "tests" / "filecheck" / "frontend").glob("*.tl")) + sorted(
    (ROOT / "tests" / "filecheck" / "diagnostics").glob("*.tl"))
SEPARATOR = re.compile(r"^# -----\s*$")


def run_tool(words: list[str], source: str, file: str) -> str:
    tool, opts = words[1], words[2:]
    defines, with_locs, sketch = {}, True, False
    it = iter(opts)
    for w in it:
        if w == "-D":
            key, _, value = next(it).partition("=")
            defines[key] = value
        elif w == "--no-locs":
            with_locs = False
        elif w == "--sketch":
            sketch = True
        elif w != "%s":
            raise ValueError(f"unsupported RUN option {w!r}")
    try:
        program = parse_text(source, file)
        if tool == "fmt":
            from tlc.frontend.format import format_program

            return format_program(program)
        graph = lower_program(program, defines, sketch)
    except TlcError as exc:
        return exc.render(GLOBAL_SOURCES) + "\n"
    return "ok\n" if tool == "check" else print_graph(graph, with_locs=with_locs)


def split_cases(text: str) -> list[str]:
    """Cases padded with blank lines so each keeps its line numbers in the file."""
    cases, current, offset = [], [], 0
    for i, line in enumerate(text.splitlines(keepends=True)):
        if SEPARATOR.match(line):
            cases.append("\n" * offset + "".join(current))
            current, offset = [], i + 1
        else:
            current.append(line)
    cases.append("\n" * offset + "".join(current))
    return cases


def filecheck(check_text: str, output: str, tmp: Path) -> int:
    check_file = tmp / "case.tl"
    check_file.write_text(check_text)
    opts = Options(match_filename=str(check_file))
    return Matcher(opts, FInput("<tlc output>", FInput.canonicalize_line_ends(output)), Parser.from_opts(opts)).run()


def run_words(text: str) -> list[str]:
    lines = re.findall(r"^#\s*RUN:\s*(.*)$", text, re.M)
    assert len(lines) == 1, "one RUN line per file"
    words = shlex.split(lines[0].partition("|")[0].replace("2>&1", ""))
    assert words[:1] == ["tlc"] and words[1] in ("check", "show", "fmt"), words
    return words


@pytest.mark.parametrize("path", CASES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_golden(path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = path.read_text()
    words = run_words(text)
    if words[1] == "fmt":
        pytest.importorskip("tlc.frontend.format")
    for n, case in enumerate(split_cases(text)):
        if "CHECK" not in case:
            continue
        output = run_tool(words, case, path.name)
        rc = filecheck(case, output, tmp_path)
        report = capsys.readouterr()
        assert rc == 0, f"{path.name} case {n}:\n{report.out}{report.err}\n--- output ---\n{output}"


def test_golden_files_exist() -> None:
    assert len([p for p in CASES if p.parent.name == "frontend"]) >= 2
    assert len([p for p in CASES if p.parent.name == "diagnostics"]) >= 2


def test_filecheck_can_fail(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert filecheck("# CHECK: error: no such message\n", "t.tl:1:1: error: another\n", tmp_path) != 0
    capsys.readouterr()


def test_cases_keep_file_line_numbers() -> None:
    cases = split_cases("a\n# -----\nb\nc\n# -----\nd\n")
    assert [c.splitlines()[-1] for c in cases] == ["a", "c", "d"]
    assert cases[2].count("\n") == 6
