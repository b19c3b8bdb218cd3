"""`tlc test` (tlc.testing.runner): correct programs pass, planted bugs are caught with a
shrunk counterexample, its location and a replay command that reproduces it, a broken
pass is named, and everything is deterministic for a seed."""
from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import ClassVar

import pytest

from tlc.frontend import ast as A
from tlc.ir.ops import LoopOp
from tlc.passes import registry
from tlc.passes.base import Pass
from tlc.testing.runner import replay, run_tl_test

ROOT = Path(__file__).resolve().parents[2]
PLANTED = sorted((ROOT / "tests" / "testing" / "planted").glob("*.tl"))
SMALL = ["HeadDim=3", "BM=2", "BN=3"]


def run(path, examples=30, seed=0, defines=SMALL, **kw) -> tuple[int, str]:
    lines: list[str] = []
    code = run_tl_test(path, examples=examples, seed=seed, defines=defines, out=lines.append, **kw)
    return code, "\n".join(lines)


def test_correct_program_passes() -> None:
    code, out = run(ROOT / "specs" / "gqa_fwd.tl", examples=40, defines=["HeadDim=5", "BM=3", "BN=4"])
    assert code == 0, out
    assert "ok: 40 examples" in out


@pytest.mark.parametrize("path", PLANTED, ids=lambda p: p.stem)
def test_planted_bug_is_caught_shrunk_and_replayable(path: Path) -> None:
    code, out = run(path)
    assert code == 1, out
    assert "FAIL" in out and "broken by the program itself" in out
    shrunk = re.search(r"counterexample \(shrunk\): batch=(\d+) heads=(\d+) kv_heads=\d+ seqlen_q=(\d+) "
                       r"seqlen_k=(\d+)", out)
    assert shrunk, out
    batch, heads, sq, sk = map(int, shrunk.groups())
    assert batch == 1 and heads <= 2 and sq <= 4 and sk <= 4, out  # minimal, not merely failing
    assert "max relative error" in out
    command = re.search(r"replay: python -m tlc.testing.runner (\S+) (.*) --replay (\S+)", out)
    assert command, out
    defines = re.findall(r"-D (\S+)", command.group(2))
    lines: list[str] = []
    assert replay(command.group(1), command.group(3), defines, out=lines.append) == 1
    assert shrunk.group(0) in "\n".join(lines)


def test_store_at_other_rows_than_the_query_load_is_refused_at_the_store() -> None:
    """Storing every query tile at tile 0 would store rows the load leaves absent once the mask pass
    zero-fills them: refused at the store's line, not tested against a kernel that means otherwise."""
    path = ROOT / "tests" / "testing" / "refused" / "store_wrong_tile.tl"
    code, out = run(path)
    store = next(i for i, line in enumerate(path.read_text().splitlines(), 1)
                 if "from register to global" in line and not line.startswith("#"))
    assert code == 1 and f"store_wrong_tile.tl:{store}:" in out and "rows come from 'Q' loaded at" in out, out


def test_planted_bug_location_is_reported() -> None:
    code, out = run(ROOT / "tests" / "testing" / "planted" / "mask_wrong_side.tl")
    assert code == 1 and re.search(r"at batch \d+, head \d+, row \d+", out), out


def test_deterministic_for_a_seed() -> None:
    path = ROOT / "tests" / "testing" / "planted" / "missing_scale.tl"
    assert run(path, seed=3) == run(path, seed=3)


def test_diagnostics_for_a_bad_program(tmp_path: Path) -> None:
    bad = tmp_path / "bad.tl"
    bad.write_text("Allocate S in smem (4, 4)\n")
    code, out = run(bad, defines=[])
    assert code == 1 and "bad.tl:1:15: error: unknown memory space 'smem'" in out


@dataclasses.dataclass(frozen=True)
class FloorBoundPass(Pass):
    """Planted pass bug: rewrites the ceil-division loop bound X / Y into a floor."""

    name: ClassVar[str] = "planted-floor-bound"

    def apply(self, ctx, graph) -> None:
        for op in graph.ops():
            if isinstance(op, LoopOp) and isinstance(op.stop, A.BinOp) and op.stop.op == "/":
                x, y = op.stop.lhs, op.stop.rhs
                floor = A.BinOp("/", A.BinOp("+", A.BinOp("-", x, y), A.Num(1)), y)
                graph.replace(op, dataclasses.replace(op, stop=floor))


@pytest.fixture
def planted_pass(monkeypatch):
    monkeypatch.setitem(registry.REGISTRY, "planted-floor-bound", lambda: FloorBoundPass)
    monkeypatch.setitem(registry.REGISTRY, "ghost", registry._lazy("tlc.passes.no_such_module:Ghost"))


def test_broken_pass_is_named(planted_pass) -> None:
    code, out = run(ROOT / "specs" / "mha_fwd.tl", pipeline=["verify", "planted-floor-bound"])
    assert code == 1, out
    assert "broken by pass 'planted-floor-bound'" in out
    assert "before passes: ok" in out and "after verify: ok" in out


def test_a_pass_that_breaks_a_program_without_variant_is_named(planted_pass) -> None:
    """Without a Variant the oracle is the program as written: a pass that changes its meaning is blamed."""
    code, out = run(ROOT / "tests" / "testing" / "long" / "sliding_window.tl", pipeline=["verify", "planted-floor-bound"])
    assert code == 1 and "broken by pass 'planted-floor-bound'" in out, out
    assert "checked against: the program as written (no Variant)" in out and "before passes: ok" in out


def test_missing_pass_module_falls_back(planted_pass) -> None:
    code, out = run(ROOT / "specs" / "mha_fwd.tl", examples=5, pipeline=["verify", "ghost", "planted-floor-bound"])
    assert code == 0, out
    assert "pass 'ghost' is not available" in out and "after 1 passes (verify)" in out


def _plugin_args() -> list[str]:
    names = {ep.name for ep in metadata.entry_points(group="pytest11")}
    return [] if "tlc" in names else ["-p", "tlc.pytest_plugin"]


def test_pytest_plugin_collects_tl_files(tmp_path: Path) -> None:
    good = (ROOT / "specs" / "gqa_fwd.tl").read_text()
    (tmp_path / "good.tl").write_text(good)
    (tmp_path / "bug.tl").write_text((ROOT / "tests" / "testing" / "planted" / "missing_scale.tl").read_text())
    (tmp_path / "golden.tl").write_text("# RUN: tlc check %s\nnot a program\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "pytest", *_plugin_args(), "--tl", "--tl-examples", "5", "-q",
                           "-p", "no:cacheprovider", "--rootdir", str(tmp_path), str(tmp_path)],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed, 1 xfailed" in proc.stdout, proc.stdout


def test_pytest_plugin_max_len_directive_and_no_reference_from_a_file(tmp_path: Path) -> None:
    """`# tlc-test: --max-len N` bounds the lengths; `--reference` in a .tl file is refused, its module
    never imported (a file must not run code it names)."""
    window = (ROOT / "tests" / "testing" / "long" / "window_start.tl").read_text()
    (tmp_path / "short.tl").write_text(window.replace("# tlc-test: xfail", "# tlc-test: --max-len 10"))
    (tmp_path / "named.tl").write_text((ROOT / "specs" / "gqa_fwd.tl").read_text()
                                       + "# tlc-test: --reference tlc_evil_refs:f\n")
    (tmp_path / "tlc_evil_refs.py").write_text("open('imported', 'w').close()\nf = None\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "pytest", *_plugin_args(), "--tl", "--tl-examples", "20", "-q",
                           "-p", "no:cacheprovider", "--rootdir", str(tmp_path), str(tmp_path)],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert "1 failed, 1 passed" in proc.stdout, proc.stdout
    assert "--reference is not read from a .tl file" in proc.stdout, proc.stdout
    assert not (tmp_path / "imported").exists()
