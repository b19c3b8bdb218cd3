"""Every shipped spec lowers cleanly, states its sketch, and interprets equal to the float64
reference at odd sizes; with its Reshape line deleted it still parses, lowers and
interprets correctly (repairing the layout is the passes' job)."""
from __future__ import annotations

from pathlib import Path

import pytest

from tlc.frontend.lower import lower_program
from tlc.frontend.parser import parse_file, parse_text
from tlc.ir.ops import ReshapeOp
from tests.frontend.document_reference import document_reference, kv_lengths_reference
from tests.frontend.group_sum_reference import group_sum_reference
from tests.frontend.lse_reference import lse_reference
from tests.frontend.merge_reference import merge_states
from tests.frontend.paged_reference import paged_reference
from tests.frontend.varlen_reference import varlen_reference
from tests.frontend.window_reference import window_reference
from tlc.testing import Shapes, check_interpreter, program_info
from tests.spec_files import ONE_KERNEL_SPECS

ROOT = Path(__file__).resolve().parents[2]
SPECS = ONE_KERNEL_SPECS   # several kernels: tests/frontend/test_kernels.py
NAMES = [p.name for p in SPECS]

# Small, odd parameter values: every spec must take them through -D.
SMALL = {"HeadDim": "5", "DQK": "7", "DV": "3", "K1": "5", "N2": "3", "BM": "3", "BN": "4", "Window": "5"}
# Specs no reference of tlc's covers, so they have no Variant (and no Causal switch): each is compared with
# a float64 reference of the test's own.
OWN_REFERENCE = {"sliding_window_fwd.tl": lambda graph: window_reference(graph.params["Window"]),
                 "document_mask_fwd.tl": lambda graph: document_reference(graph.params["Causal"], graph.params["Align"]),
                 "kv_lengths_fwd.tl": lambda graph: kv_lengths_reference(graph.params["Causal"]),
                 "mha_lse_fwd.tl": lambda graph: lse_reference(graph.params["Causal"], graph.params["Align"]),
                 "group_sum_fwd.tl": lambda graph: group_sum_reference(graph.params["Causal"], graph.params["Align"]),
                 "merge_states.tl": lambda graph: merge_states,
                 "paged_kv_fwd.tl": lambda graph: paged_reference(graph.params["PageSize"], graph.params["Causal"]),
                 "varlen_fwd.tl": lambda graph: varlen_reference(graph.params["Causal"])}
# Own-reference specs without a Causal switch: the program itself says which keys (if any) a row sees.
NO_CAUSAL = {"sliding_window_fwd.tl", "merge_states.tl"}

# (batch, heads, kv_heads, seqlen_q, seqlen_k): 1, exact tiles, ragged tails, q != k, GQA groups.
SIZES = [(1, 1, 1, 1, 1), (1, 2, 1, 3, 8), (2, 4, 2, 7, 9), (1, 2, 2, 10, 3), (1, 3, 1, 1, 13)]


def small_defines(path: Path) -> dict[str, str]:
    params = lower_program(parse_file(path)).params
    return {k: v for k, v in SMALL.items() if k in params}


def shapes_for(graph, batch, heads, kv_heads, sq, sk) -> Shapes:
    kv = kv_heads if "kv" in {t.heads for t in program_info(graph).tensors} else heads
    floats = {"scale": 0.37} if "scale" in graph.inputs else {}
    return Shapes(batch, heads, kv, {"seqlen_q": sq, "seqlen_k": sk}, floats)


def test_specs_exist() -> None:
    assert {"mha_fwd.tl", "gqa_fwd.tl", "mqa_fwd.tl", "mla_prefill_fwd.tl", "mla_decode_fwd.tl",
            "b2b_gemm_relu.tl", "softcap_fwd.tl"} <= set(NAMES)


@pytest.mark.parametrize("path", SPECS, ids=NAMES)
def test_spec_lowers_with_defaults_and_has_a_sketch(path: Path) -> None:
    graph = lower_program(parse_file(path))
    if path.name in OWN_REFERENCE:
        assert "Variant" not in graph.params and ("Causal" in graph.params) == (path.name not in NO_CAUSAL)
    else:
        assert {"Variant", "Causal", "Align"} <= set(graph.params)
    assert "Sketch:" in path.read_text()


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
@pytest.mark.parametrize("path", SPECS, ids=NAMES)
def test_spec_interprets_equal_to_reference(path: Path, causal: bool) -> None:
    switch = "Causal" in lower_program(parse_file(path)).params
    if not switch and causal:
        pytest.skip("no Causal switch: the program says which keys each row sees")
    defines = dict(small_defines(path), **({"Causal": str(causal).lower()} if switch else {}))
    graph = lower_program(parse_file(path), defines)
    if graph.params.get("Variant", "attention") != "attention" and causal:
        pytest.skip("no causal form of this variant")
    reference = OWN_REFERENCE[path.name](graph) if path.name in OWN_REFERENCE else None
    for i, size in enumerate(SIZES):
        result = check_interpreter(graph, shapes_for(graph, *size), seed=i, reference=reference)
        assert result.ok, f"{path.name} {size}: {result.describe()}"


@pytest.mark.parametrize("path", SPECS, ids=NAMES)
def test_spec_without_reshape_still_interprets(path: Path) -> None:
    text = "".join(line for line in path.read_text().splitlines(keepends=True)
                   if not line.lstrip().startswith("Reshape"))
    graph = lower_program(parse_text(text, path.name), small_defines(path))
    assert not any(isinstance(op, ReshapeOp) for _, op in graph.walk())
    reference = OWN_REFERENCE[path.name](graph) if path.name in OWN_REFERENCE else None
    for i, size in enumerate(SIZES[:3]):
        result = check_interpreter(graph, shapes_for(graph, *size), seed=i, check_layouts=False, reference=reference)
        assert result.ok, f"{path.name} {size}: {result.describe()}"


def test_defines_override_params() -> None:
    graph = lower_program(parse_file(ROOT / "specs" / "mla_prefill_fwd.tl"), {"DQK": "64", "Causal": "false"})
    assert graph.params["DQK"] == 64 and graph.params["Causal"] is False and graph.params["DV"] == 128


def test_mla_prefill_is_bottom_right_causal() -> None:
    params = lower_program(parse_file(ROOT / "specs" / "mla_prefill_fwd.tl")).params
    assert (params["Causal"], params["Align"], params["DQK"], params["DV"]) == (True, "bottom_right", 192, 128)


def test_mla_decode_shares_one_latent_kv_head() -> None:
    graph = lower_program(parse_file(ROOT / "specs" / "mla_decode_fwd.tl"))
    offsets = {op.name: str(op.offset) for _, op in graph.walk() if getattr(op, "space", "") == "global"}
    assert offsets["K"] == offsets["V"] == "0" and offsets["Q"] == "head_idx"
    assert (graph.params["DQK"], graph.params["DV"]) == (576, 512)
