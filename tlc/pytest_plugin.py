"""pytest plugin (entry point `pytest11: tlc`): `pytest --tl specs/` collects `.tl` files
as property tests, each running `tlc test` (tlc.testing.runner) on the CPU interpreter.

A `.tl` file may steer its own test with comment lines:
    # tlc-test: -D HeadDim=16 -D BM=4     (parameters for the test)
    # tlc-test: --max-len 64              (the longest sequence length drawn)
    # tlc-test: xfail                     (a planted bug: the test must find a failure)
    # tlc-test: skip
A file cannot name a `--reference`: that would import code a .tl file names; a program without a
Variant is checked against itself as written (docs/testing.md).
Files with FileCheck `RUN:` lines are golden tests, not programs, and are not collected.
"""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

_DIRECTIVE = re.compile(r"^\s*#\s*tlc-test:(.*)$", re.MULTILINE)
_RUN = re.compile(r"^\s*#\s*RUN:", re.MULTILINE)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("tlc", "TL program property tests")
    group.addoption("--tl", action="store_true", default=False, help="collect .tl files as property tests")
    group.addoption("--tl-examples", type=int, default=20, metavar="N", help="hypothesis examples per .tl file")
    group.addoption("--tl-seed", type=int, default=0, metavar="S", help="hypothesis seed (deterministic)")
    group.addoption("--tl-define", action="append", default=[], metavar="NAME=VALUE",
                    help="bind a Param in every collected program (repeatable)")
    group.addoption("--tl-max-len", type=int, default=None, metavar="N",
                    help="the longest sequence length drawn (default: eight tiles of the largest tile, and one)")


def pytest_collect_file(parent: pytest.Collector, file_path: Path):
    if file_path.suffix != ".tl" or not parent.config.getoption("tl"):
        return None
    try:
        head = file_path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    if _RUN.search(head):
        return None
    return TlFile.from_parent(parent, path=file_path)


class TlFailure(Exception):
    """`tlc test` found a counterexample; the message is its report."""


class TlFile(pytest.File):
    def collect(self):
        defines, flags, max_len, problems = [], set(), None, []
        text = self.path.read_text(encoding="utf-8", errors="replace")
        for m in _DIRECTIVE.finditer(text):
            words = shlex.split(m.group(1))
            i = 0
            while i < len(words):
                word = words[i]
                if word.startswith("--max-len="):
                    word, value = word.split("=", 1)
                    words[i:i + 1] = [word, value]
                if word in ("-D", "--max-len") and i + 1 < len(words):
                    if word == "-D":
                        defines.append(words[i + 1])
                    elif words[i + 1].isdigit() and int(words[i + 1]) >= 1:
                        max_len = int(words[i + 1])
                    else:
                        problems.append(f"--max-len {words[i + 1]!r} is not a length; write a whole number from 1")
                    i += 2
                    continue
                if word.startswith("--reference"):
                    problems.append("--reference is not read from a .tl file (it would import code the file names); "
                                    "run `tlc test FILE --reference MODULE:FUNCTION`, or check_program(…, reference=)")
                elif word.startswith("-D"):
                    defines.append(word[2:])
                else:
                    flags.add(word.lower())
                i += 1
        item = TlItem.from_parent(self, name="property", defines=defines, max_len=max_len, problems=problems)
        if "skip" in flags:
            item.add_marker(pytest.mark.skip(reason="# tlc-test: skip"))
        if "xfail" in flags and not problems:
            item.add_marker(pytest.mark.xfail(reason="planted bug: tlc test must find it", raises=TlFailure,
                                              strict=True))
        yield item


class TlItem(pytest.Item):
    def __init__(self, *, defines: list[str], max_len: int | None = None, problems: list[str] | None = None,
                 **kw) -> None:
        super().__init__(**kw)
        self.defines = defines
        self.max_len = max_len
        self.problems = problems or []

    def runtest(self) -> None:
        from tlc.testing.runner import run_tl_test

        if self.problems:
            raise TlFailure("\n".join(f"{self.path.name}: # tlc-test: {p}" for p in self.problems))
        cfg = self.config
        lines: list[str] = []
        max_len = cfg.getoption("tl_max_len") or self.max_len
        code = run_tl_test(self.path, examples=cfg.getoption("tl_examples"), seed=cfg.getoption("tl_seed"),
                           defines=self.defines + list(cfg.getoption("tl_define")), out=lines.append,
                           max_len=max_len)
        if code != 0:
            raise TlFailure("\n".join(lines))

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, TlFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, 0, f"tlc test {self.path}"
