"""Every planted bug of tests/testing/planted changes the kernel: the emitted CuTe of the buggy
program differs from that of its fixed twin (built with the same defines, no NVRTC). A planted
bug that built into the correct program's kernel would be a silent miscompile."""
from __future__ import annotations

from pathlib import Path

import pytest

from tlc.lowering.emit_text import emit_text

PLANTED = Path(__file__).resolve().parents[1] / "testing" / "planted"
# planted file → (buggy text, fixed text): the fix undoes exactly the planted change
FIXES = {
    "gqa_wrong_kv_head": [("head_idx % group", "head_idx / group")],
    "loop_off_by_one": [("for n = 0:seqlen_k / BN - 1", "for n = 0:seqlen_k / BN")],
    "mask_wrong_side": [("causal bottom_right", "causal top_left")],
    "missing_scale": [("  Compute Mask S causal Align", "  Compute Multiply S, scale and get new S\n"
                                                         "  Compute Mask S causal Align")],
    "softcap_mask_first": [("  Compute Mask S causal Align and get new S when Causal\n", ""),
                           ("  Compute Multiply S, Softcap and get new S\n",
                            "  Compute Multiply S, Softcap and get new S\n"
                            "  Compute Mask S causal Align and get new S when Causal\n")],
}


def _cute(text: str, name: str) -> str:
    return emit_text(text.encode(), f"{name}.tl", "sm_90", {"HeadDim": "64"}, "cute", line_directives=False)


def test_every_planted_file_has_a_fix() -> None:
    assert sorted(p.stem for p in PLANTED.glob("*.tl")) == sorted(FIXES)


@pytest.mark.parametrize("name", sorted(FIXES))
def test_planted_bug_changes_the_kernel(name: str) -> None:
    lines = (PLANTED / f"{name}.tl").read_text().splitlines()
    buggy = "\n".join(line for line in lines if not line.lstrip().startswith("#")) + "\n"  # fixes touch code only
    fixed = buggy
    for old, new in FIXES[name]:
        assert old in fixed, (name, old)
        fixed = fixed.replace(old, new, 1)
    assert fixed != buggy
    assert _cute(buggy, name) != _cute(fixed, name)
