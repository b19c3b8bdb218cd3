"""FileCheck tests of the kernel-IR transforms: tests/filecheck/kir/<pass_name>.kir, run in process.

Each file is kernel-IR text (the program as the transform receives it in the lowering pipeline, from
`tlc show --print-after`, trimmed) with comment lines on top, one or more of them RUN lines:

    // RUN: tlc opt %s --pass lazy-rescale | filecheck %s
    // RUN: tlc opt %s --pass lazy-rescale --fact stale-max="P is scaled" | filecheck %s --check-prefix KEPT

Each RUN line is `tlc opt` (through tlc.cli.main, so its errors are the command's) whose stdout, and
with `2>&1` its stderr, is checked with that line's prefix.
"""
from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest
from filecheck.finput import FInput
from filecheck.matcher import Matcher
from filecheck.options import Options
from filecheck.parser import Parser

from tlc.cli import main
from tlc.kir.transforms.registry import TRANSFORMS

ROOT = Path(__file__).resolve().parents[2]
CASES = sorted((ROOT / "tests" / "filecheck" / "kir").glob("*.kir"))


def run_lines(text: str) -> list[tuple[list[str], bool, str]]:
    """(tlc arguments, stderr too, check prefix) of each RUN line."""
    runs = []
    for line in re.findall(r"^//\s*RUN:\s*(.*)$", text, re.M):
        tool, _, check = line.partition("|")
        words = shlex.split(tool.replace("2>&1", ""))
        assert words[:2] == ["tlc", "opt"], f"a RUN line runs tlc opt, not {words[:2]}"
        cwords = shlex.split(check)
        assert cwords[:1] == ["filecheck"], line
        prefix = cwords[cwords.index("--check-prefix") + 1] if "--check-prefix" in cwords else "CHECK"
        runs.append((words[1:], "2>&1" in tool, prefix))
    return runs


def run_tlc(args: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(args)
    return rc, out.getvalue(), err.getvalue()


def filecheck(path: Path, output: str, prefix: str) -> int:
    opts = Options(match_filename=str(path), check_prefixes=[prefix])
    return Matcher(opts, FInput("<tlc opt>", FInput.canonicalize_line_ends(output)), Parser.from_opts(opts)).run()


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.name)
def test_kir_filecheck(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = run_lines(path.read_text())
    assert runs, f"{path.name} has no RUN line"
    for args, with_stderr, prefix in runs:
        rc, out, err = run_tlc([str(path) if a == "%s" else a for a in args])
        output = out + err if with_stderr else out
        assert rc == 0 or with_stderr, f"{path.name}: tlc {' '.join(args)} failed:\n{err}"
        checked = filecheck(path, output, prefix)
        report = capsys.readouterr()
        assert checked == 0, f"{path.name} ({prefix}):\n{report.out}{report.err}\n--- output ---\n{output}"


def test_every_transform_has_a_filecheck_test() -> None:
    assert {p.stem.replace("_", "-") for p in CASES} >= set(TRANSFORMS)


def test_filecheck_can_fail(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    check = tmp_path / "bad.kir"
    check.write_text("// CHECK: no such line\n")
    assert filecheck(check, "other output\n", "CHECK") != 0
    capsys.readouterr()


@pytest.mark.parametrize("args, words", [
    (["--pass", "nope"], "error: --pass nope: unknown kernel-IR transform; the transforms are defer-reductions,"),
    (["--pass", "check-resources"], "error: --pass check-resources: not a kernel-IR transform (it needs the TL graph"),
    (["--pass", "pipeline{x=1}"], "error: pass 'pipeline' has no option 'x'; options: stages"),
    (["--pass", "pipeline", "--schedule", "Stages=9"], "error: Param Stages = 9: the cp.async pipeline runs 1 or 2"),
    (["--pass", "pipeline", "--schedule", "Nope=1"], "error: --schedule Nope: no such schedule knob; the knobs are"),
    (["--pass", "lazy-rescale", "--fact", "nope=x"], "error: --fact nope: no such fact; the facts are stale-max"),
])
def test_opt_refuses_in_one_line(tmp_path: Path, args: list[str], words: str) -> None:
    path = tmp_path / "k.kir"
    path.write_text("ProgramOp(name=k, body=[])\n")
    rc, out, err = run_tlc(["opt", str(path), *args])
    assert rc == 1 and not out and err.startswith(words) and err.count("\n") == 1, err


@pytest.mark.parametrize("text, words", [
    ("ProgramOp(name=k, body=[\n", ":1:25: error: kernel IR: expected ']' or a name"),
    ("// a comment\nBarrierOp()\n", ":1:1: error: the text is a BarrierOp, not a ProgramOp"),
    ("ProgramOp(name=k, body=[Nope()])\n", ":1:25: error: unknown kernel-IR op 'Nope'"),
])
def test_opt_refuses_bad_text_at_its_line(tmp_path: Path, text: str, words: str) -> None:
    path = tmp_path / "k.kir"
    path.write_text(text)
    rc, out, err = run_tlc(["opt", str(path), "--pass", "insert-sync"])
    assert rc == 1 and err.startswith(f"{path}{words}") and err.count("\n") == 1, err
