"""The TL graph's canonical text: print → parse → print is the identity for every spec."""
from __future__ import annotations

from pathlib import Path

import pytest

from tlc.api import lower_source
from tlc.diagnostics import TlcError
from tlc.ir.irparser import parse_ir
from tlc.ir.printer import print_graph
from tlc.ir.verify import verify_structure
from tests.spec_files import ONE_KERNEL_SPECS

SPECS = ONE_KERNEL_SPECS


@pytest.mark.parametrize("spec", SPECS, ids=lambda p: p.stem)
@pytest.mark.parametrize("causal", ["false", "true"])
def test_print_parse_print(spec: Path, causal: str) -> None:
    defines = {"Causal": causal} if "Param Causal" in spec.read_text() else {}
    g = lower_source(spec.read_bytes(), spec.name, defines=defines)
    text = print_graph(g)
    again = parse_ir(text)
    assert print_graph(again) == text
    assert verify_structure(again) == []


def test_parsed_ir_interprets_like_the_original() -> None:
    import math

    import torch

    from tlc.ir.interpreter import run_program

    spec = SPECS[0].parent / "mha_fwd.tl"
    g = lower_source(spec.read_bytes(), "mha_fwd.tl", defines={"HeadDim": "16", "BM": "16", "BN": "8"})
    g2 = parse_ir(print_graph(g))
    q, k, v = (torch.randn(1, 2, n, 16, dtype=torch.float64) for n in (17, 33, 33))
    o = torch.full((1, 2, 17, 16), float("nan"), dtype=torch.float64)
    scalars = dict(seqlen_q=17, seqlen_k=33, scale=1 / math.sqrt(16))
    a = run_program(g, dict(Q=q, K=k, V=v, O=o), scalars)["O"]
    b = run_program(g2, dict(Q=q, K=k, V=v, O=o), scalars)["O"]
    assert torch.equal(a, b) and not torch.isnan(a).any()


@pytest.mark.parametrize("text, message", [
    ("", "expected tl.program"),
    ('tl.program "x"\n%a = nosuch() : register(?) fp32', "unknown op 'nosuch'"),
    ('tl.program "x"\n%a = elementwise(%b) {fn = exp} : register(?) fp32', "%b is used before it is defined"),
    ('tl.program "x"\n%a = full() {value = 0.0} : register(?) fp32, register(?) fp32', "1 results but 2 types"),
])
def test_malformed_ir_is_a_diagnostic(text: str, message: str) -> None:
    with pytest.raises(TlcError) as exc:
        parse_ir(text)
    assert message in exc.value.render()
