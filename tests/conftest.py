"""Shared fixtures: the repository root, the shipped specs, and a diagnostics helper."""
from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SPECS = sorted((ROOT / "specs").glob("*.tl"))


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return ROOT


def diagnostics_of(source: str | bytes, file: str = "t.tl", *, sketch: bool = False, defines=None) -> list[str]:
    """`line:col: message` for every error parse + lower report ([] when the program is fine)."""
    from tlc.diagnostics import TlcError
    from tlc.frontend.lower import lower_program
    from tlc.frontend.parser import parse_text

    try:
        lower_program(parse_text(source, file), defines, sketch)
    except TlcError as exc:
        return [f"{d.loc.line}:{d.loc.col}: {d.message}" if d.loc else d.message for d in exc.diagnostics]
    return []


@pytest.fixture
def diags():
    return diagnostics_of
