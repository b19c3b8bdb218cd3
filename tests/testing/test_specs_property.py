"""Issue bar: `tlc test specs/<each>.tl --examples 200` passes on the CPU, in CI."""
from __future__ import annotations

from pathlib import Path

import pytest

from tlc.cli import main
from tests.spec_files import ONE_KERNEL_SPECS

SPECS = ONE_KERNEL_SPECS


@pytest.mark.parametrize("spec", SPECS, ids=lambda p: p.stem)
def test_spec_passes_200_examples(spec: Path, capsys) -> None:
    assert main(["test", str(spec), "--examples", "200", "--seed", "0"]) == 0, capsys.readouterr().out
    assert "ok: 200 examples" in capsys.readouterr().out
