"""docs/passes.md works as written: its `python` blocks run in order (defining, registering
and running `fold-mul-one`), its `tl` block passes as a golden FileCheck test, and its
entry-point declaration registers the pass from a package of one's own."""
from __future__ import annotations

import re
import sys
import types
from importlib import metadata
from pathlib import Path

import pytest

from test_filecheck_passes import compile_file, filecheck
from tlc.passes import registry

DOC = Path(__file__).resolve().parents[2] / "docs" / "passes.md"
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)


def blocks(lang: str) -> list[tuple[int, str]]:
    text = DOC.read_text()
    return [(text[: m.start()].count("\n") + 2, m.group(2)) for m in BLOCK.finditer(text) if m.group(1) == lang]


@pytest.fixture
def clean_registry(monkeypatch: pytest.MonkeyPatch):
    """The doc registers passes; leave the registry as the other tests expect it."""
    monkeypatch.setattr(registry, "REGISTRY", dict(registry.REGISTRY))
    yield registry.REGISTRY


def run_doc_python(module_name: str) -> types.ModuleType:
    # A real module, so dataclasses resolve `ClassVar` in the string annotations.
    module = types.ModuleType(module_name)
    sys.modules[module_name] = module
    try:
        for line, code in blocks("python"):
            exec(compile(code, f"{DOC}:{line}", "exec"), module.__dict__)
    finally:
        del sys.modules[module_name]
    return module


def test_python_blocks_run(clean_registry) -> None:
    module = run_doc_python("docs_passes_example")
    assert clean_registry["fold-mul-one"]() is module.FoldMulOnePass
    assert module.FoldMulOnePass.name == "fold-mul-one"


def test_golden_block_passes(clean_registry, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_doc_python("docs_passes_golden")
    [(_, golden)] = blocks("tl")
    path = tmp_path / "fold_mul_one.tl"
    path.write_text(golden)
    run, output = compile_file(path)
    assert filecheck(path, output, run.check_prefix) == 0, capsys.readouterr().out + "\n" + output
    broken = tmp_path / "fold_mul_one_broken.tl"  # and the golden test can fail
    broken.write_text(golden.replace("dropped a multiply", "dropped a divide"))
    run, output = compile_file(broken)
    assert filecheck(broken, output, run.check_prefix) != 0
    capsys.readouterr()


def test_entry_point_registration(clean_registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    [(_, ini)] = blocks("ini")
    name, target = (s.strip() for s in ini.strip().splitlines()[-1].split("="))
    package, module = target.split(":")[0].split(".")
    (tmp_path / package).mkdir()
    (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / package / f"{module}.py").write_text(blocks("python")[0][1])
    monkeypatch.syspath_prepend(str(tmp_path))
    eps = [metadata.EntryPoint(name=name, value=target, group="tlc.passes")]
    monkeypatch.setattr(registry.metadata, "entry_points", lambda group=None: eps if group == "tlc.passes" else [])
    clean_registry.pop(name, None)
    cls = registry.lookup(name)
    assert cls is not None and cls.name == name and cls.__module__ == f"{package}.{module}"
    sys.modules.pop(f"{package}.{module}", None)
    sys.modules.pop(package, None)
