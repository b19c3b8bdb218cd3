"""Every failure honest (passes): a program that computes nothing or stores no result is
rejected by verify-final at a located line; sketches, which may omit stores, are not; and
checking stays linear in program size (counted in Python calls, not seconds)."""
from __future__ import annotations

import cProfile
import pstats
from pathlib import Path

import pytest

from tlc.api import check_source
from tlc.cli import main
from tests.spec_files import ONE_KERNEL_SPECS

ROOT = Path(__file__).resolve().parents[2]
SPECS = ONE_KERNEL_SPECS
MHA = "".join(line for line in (ROOT / "specs" / "mha_fwd.tl").read_text().splitlines(True)
              if not line.startswith("#"))
STORE_O = "Copy O (BM, HeadDim) in coordinate [L = block_idx] from register to global\n"


def line_of(text: str, fragment: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if fragment in line)


def errors(text: str, **kw) -> list[tuple[int, int, str]]:
    res = check_source(text, "p.tl", **kw)
    return [(d.loc.line, d.loc.col, d.message) for d in res.diagnostics if d.severity == "error"]


# ------------------------------------------------------------------ no result


def test_output_allocated_but_never_stored_names_its_allocate() -> None:
    text = MHA.replace(STORE_O, "")
    assert errors(text) == [(line_of(text, "Allocate O in global"), 1,
                             "'O' is allocated in global memory but never stored, so the kernel has no result "
                             "there; add 'Copy O (rows, cols) in coordinate [L = block_idx] from register to "
                             "global' after its computation, or remove the Allocate")]


def test_output_never_stored_through_the_cli(tmp_path, capsys) -> None:
    path = tmp_path / "nostore.tl"
    path.write_text(MHA.replace(STORE_O, ""))
    assert main(["check", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"nostore.tl:{line_of(MHA, 'Allocate O in global')}:1: error: 'O' is allocated in global memory but " \
           "never stored" in err


def test_a_program_that_loads_everything_and_stores_nothing_is_rejected() -> None:
    text = MHA.replace(STORE_O, "").replace("Allocate O in global (seqlen_q, HeadDim) with offset head_idx\n", "")
    (found,) = errors(text)
    assert found[0] == line_of(text, "Compute Divide O, l") and "stores nothing to global memory" in found[2]


def test_a_program_with_no_compute_is_rejected() -> None:
    text = ("Param dtype = bf16\nParam BM = 64\nParam D = 64\nInput seqlen_q : int\n"
            "Allocate O in global (seqlen_q, D)\nAllocate O in register (BM, D)\n"
            "Copy O (BM, D) in coordinate [L = block_idx] from register to global\n")
    (found,) = errors(text)
    assert found[:2] == (5, 1) and found[2].startswith("the program computes nothing: it has no Compute statement")
    store = "Copy O (BM, D) in coordinate [L = block_idx] from register"
    assert errors(text.replace(store, "Compute Exp O and get new O\n" + store)) == []


@pytest.mark.parametrize("spec", SPECS, ids=lambda p: p.stem)
def test_shipped_specs_still_check(spec: Path) -> None:
    res = check_source(spec.read_bytes(), str(spec))
    assert res.ok, res.rendered


def test_a_sketch_may_leave_the_store_out() -> None:
    sketch = ("Param BM\nCopy Q from global to shared\nfor n = 0:N\n  Copy K from global to shared\n"
              "  Compute GEMM Q, K.T and get S\nend\n")
    assert check_source(sketch, "s.tl", sketch=True).ok


# ------------------------------------------------------------------ linear in program size


def in_loop(n: int) -> str:
    """The issue's shape: one statement repeated inside the KV loop."""
    line = "  Compute Multiply S, scale and get new S\n"
    return MHA.replace(line, line * n)


def reloads(n: int) -> str:
    """Many global loads: verify-final and the mask pass look up each one's producer."""
    line = "  Copy K (BN, HeadDim) in coordinate [L = n] from global to shared\n"
    return MHA.replace(line, line * n)


def calls(text: str) -> int:
    profile = cProfile.Profile()
    profile.enable()
    res = check_source(text, "big.tl")
    profile.disable()
    assert res.ok, res.rendered[:500]
    return pstats.Stats(profile).total_calls  # type: ignore[attr-defined]


@pytest.mark.parametrize("shape", [in_loop, reloads], ids=lambda f: f.__name__)
def test_checking_is_linear_in_program_size(shape) -> None:
    """4x the statements must cost about 4x the work; a quadratic step would cost 16x
    (the reloads shape cost 10x at these sizes before Graph.producer was indexed)."""
    calls(shape(10))  # warm the parser cache
    small, large = calls(shape(200)), calls(shape(800))
    assert large / small < 5.0, (small, large)
