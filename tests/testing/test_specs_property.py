"""Issue bar: `tlc test specs/<each>.tl --examples 200` passes on the CPU, in CI (the slow leg: about four minutes
on two cores); the test command checks each spec on 20 examples."""
from __future__ import annotations

from pathlib import Path

import pytest

from tlc.cli import main
from tests.spec_files import ONE_KERNEL_SPECS

SPECS = ONE_KERNEL_SPECS


def _passes(spec: Path, examples: int, capsys) -> None:
    assert main(["test", str(spec), "--examples", str(examples), "--seed", "0"]) == 0, capsys.readouterr().out
    assert f"ok: {examples} examples" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize("spec", SPECS, ids=lambda p: p.stem)
def test_spec_passes_200_examples(spec: Path, capsys) -> None:
    _passes(spec, 200, capsys)


@pytest.mark.parametrize("spec", SPECS, ids=lambda p: p.stem)
def test_spec_passes_20_examples(spec: Path, capsys) -> None:
    _passes(spec, 20, capsys)
