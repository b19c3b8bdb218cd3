"""The attention runtime lives in the package tlc.attention, while the name `tlc.attention` stays the
function: importing the package's modules, in any order and before or after `import tlc`, never rebinds it,
and `import tlc` loads neither torch nor the runtime."""
from __future__ import annotations

import subprocess
import sys

import pytest

MODULES = ("sdpa", "kernels", "tuning", "torch_op", "shapes", "precompile")


def _fresh(code: str) -> str:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


@pytest.mark.parametrize("module", MODULES)
def test_importing_a_runtime_module_first_leaves_tlc_attention_the_function(module) -> None:
    out = _fresh(f"from tlc.attention import {module}\nimport tlc\n"
                 "print(type(tlc.attention).__name__, tlc.attention.__module__, tlc.attention.__name__)")
    assert out == "function tlc attention"


def test_import_tlc_loads_no_torch_and_no_runtime_module() -> None:
    out = _fresh("import sys, tlc\n"
                 "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('tlc.attention.')))")
    assert out == "[]"


def test_the_custom_op_and_the_public_names_after_every_module() -> None:
    import importlib

    import torch

    import tlc

    for module in MODULES:
        importlib.import_module(f"tlc.attention.{module}")
    assert callable(tlc.attention) and tlc.attention.__module__ == "tlc"
    assert callable(tlc.build) and callable(tlc.precompile)
    assert torch.ops.tlc.attention.default is not None
