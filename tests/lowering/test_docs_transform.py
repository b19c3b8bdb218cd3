"""docs/lowering.md's worked example works as written: its `hoist-lets` module, run as a kernel-IR
transform, passes the FileCheck test beside it (through `tlc opt`), and that test can fail."""
from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest

from tests.lowering.test_filecheck_kir import filecheck, run_lines, run_tlc
from tlc.kir.transforms import registry

DOC = Path(__file__).resolve().parents[2] / "docs" / "lowering.md"
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)


def example(lang: str) -> str:
    """The one `lang` block of the section 'Adding a kernel-IR transform'."""
    text = DOC.read_text()
    section = text[text.index("## Adding a kernel-IR transform"):]
    section = section[:section.index("\n## ")]
    (block,) = [m.group(2) for m in BLOCK.finditer(section) if m.group(1) == lang]
    return block


@pytest.fixture
def hoist_lets(monkeypatch: pytest.MonkeyPatch) -> type:
    """The doc's module, registered under its pass name for this test only."""
    module = types.ModuleType("docs_hoist_lets")
    monkeypatch.setitem(sys.modules, module.__name__, module)   # dataclasses resolve ClassVar through it
    exec(compile(example("python"), f"{DOC}:hoist_lets.py", "exec"), module.__dict__)
    cls = module.HoistLetsTransform
    monkeypatch.setitem(registry.TRANSFORMS, cls.name, lambda: cls)
    return cls


def _check(path: Path) -> tuple[int, str]:
    (args, _, prefix), = run_lines(path.read_text())
    rc, out, err = run_tlc([str(path) if a == "%s" else a for a in args])
    assert rc == 0, err
    return filecheck(path, out, prefix), out


def test_the_example_passes_its_filecheck_test(hoist_lets, tmp_path: Path, capsys) -> None:
    assert hoist_lets.name == "hoist-lets"
    path = tmp_path / "hoist_lets.kir"
    path.write_text(example("kir"))
    checked, out = _check(path)
    assert checked == 0, capsys.readouterr().out + out
    broken = tmp_path / "broken.kir"
    broken.write_text(example("kir").replace("before loop n", "after loop n"))
    assert _check(broken)[0] != 0
    capsys.readouterr()
