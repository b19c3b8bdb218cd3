"""The interpreter's Softmax is over the loop's whole domain; a per-tile (wrong) reading is
caught by comparing against the reference once seqlen_k exceeds one tile (BN)."""
from __future__ import annotations

from pathlib import Path

import pytest

from tlc.frontend.lower import lower_program
from tlc.frontend.parser import parse_file
from tlc.ir import interpreter
from tlc.testing import Shapes, check_interpreter

SPEC = Path(__file__).resolve().parents[2] / "specs" / "mha_fwd.tl"
DEFINES = {"HeadDim": "4", "BM": "2", "BN": "3"}


@pytest.fixture
def per_tile_softmax(monkeypatch):
    """Planted bug: skip the whole-domain sweep, so each tile normalises by itself."""
    monkeypatch.setattr(interpreter.Interpreter, "_domain_stats", lambda self, *a, **k: None)


def shapes(sk: int) -> Shapes:
    return Shapes(1, 2, 2, {"seqlen_q": 5, "seqlen_k": sk}, {"scale": 0.5})


def graph():
    return lower_program(parse_file(SPEC), DEFINES)


def test_domain_softmax_matches_reference() -> None:
    for sk in (1, 3, 4, 7):
        assert check_interpreter(graph(), shapes(sk)).ok


def test_per_tile_softmax_is_caught_beyond_one_tile(per_tile_softmax) -> None:
    result = check_interpreter(graph(), shapes(7))
    assert not result.ok and result.max_error > 1e-3 and result.where is not None


def test_per_tile_softmax_is_invisible_within_one_tile(per_tile_softmax) -> None:
    # one KV tile: per-tile and whole-domain readings agree, so the catch above is the bug
    assert check_interpreter(graph(), shapes(3)).ok
