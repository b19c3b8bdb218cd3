"""pytest plugin (entry point `pytest11: tlc`): `pytest --tl specs/` collects `.tl` files
as property tests, each running `tlc test` (tlc.testing.runner) on the CPU interpreter.

A `.tl` file may steer its own test with comment lines:
    # tlc-test: -D HeadDim=16 -D BM=4     (parameters for the test)
    # tlc-test: xfail                     (a planted bug: the test must find a failure)
    # tlc-test: skip
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
        defines, flags = [], set()
        text = self.path.read_text(encoding="utf-8", errors="replace")
        for m in _DIRECTIVE.finditer(text):
            words = shlex.split(m.group(1))
            i = 0
            while i < len(words):
                if words[i] == "-D" and i + 1 < len(words):
                    defines.append(words[i + 1])
                    i += 2
                    continue
                if words[i].startswith("-D"):
                    defines.append(words[i][2:])
                else:
                    flags.add(words[i].lower())
                i += 1
        item = TlItem.from_parent(self, name="property", defines=defines)
        if "skip" in flags:
            item.add_marker(pytest.mark.skip(reason="# tlc-test: skip"))
        if "xfail" in flags:
            item.add_marker(pytest.mark.xfail(reason="planted bug: tlc test must find it", raises=TlFailure,
                                              strict=True))
        yield item


class TlItem(pytest.Item):
    def __init__(self, *, defines: list[str], **kw) -> None:
        super().__init__(**kw)
        self.defines = defines

    def runtest(self) -> None:
        from tlc.testing.runner import run_tl_test

        cfg = self.config
        lines: list[str] = []
        code = run_tl_test(self.path, examples=cfg.getoption("tl_examples"), seed=cfg.getoption("tl_seed"),
                           defines=self.defines + list(cfg.getoption("tl_define")), out=lines.append)
        if code != 0:
            raise TlFailure("\n".join(lines))

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, TlFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, 0, f"tlc test {self.path}"
