"""Builds refuse an sm_90a kernel whose synchronisation the protocol checker (tlc.kir.sm90_protocol) finds
broken or cannot follow, at the TL line of the op involved, before NVRTC: the same refusal for `tlc build`,
`tlc check`, `tlc.build` and `tlc.attention` (all lower through tlc.builder.lower_to_kernel_ir)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tlc.builder import lower_to_kernel_ir, refuse_unproved_protocol
from tlc.diagnostics import TlcError
from tlc.kir import ops as K
from tlc.kir import ops_sm90 as H

SPEC = Path(__file__).resolve().parents[2] / "specs" / "mha_fwd.tl"
D256_PERSISTENT = {"HeadDim": "256", "Persistent": "true"}


def _without(program: K.ProgramOp, cls: type) -> K.ProgramOp:
    def block(ops):
        return tuple(dataclasses.replace(op, **{r: block(getattr(op, r)) for r in op.regions}) if op.regions else op
                     for op in ops if not isinstance(op, cls))
    return dataclasses.replace(program, body=block(program.body))


def test_a_kernel_the_checker_proves_is_built() -> None:
    state, _ = lower_to_kernel_ir(SPEC.read_bytes(), str(SPEC), "sm_90a", D256_PERSISTENT, name="mha_fwd")
    assert any(isinstance(op, H.FenceProxyAsyncOp) for op in K.walk(state.kir))


def test_a_kernel_without_its_proxy_fence_is_refused_at_a_tl_line() -> None:
    """The epilogue's staging tile lies over Q's bytes at d = 256: without the fence before Q's release, the
    next tile's TMA load may overtake the epilogue's writes."""
    state, _ = lower_to_kernel_ir(SPEC.read_bytes(), str(SPEC), "sm_90a", D256_PERSISTENT, name="mha_fwd")
    with pytest.raises(TlcError) as exc:
        refuse_unproved_protocol(_without(state.kir, H.FenceProxyAsyncOp), "sm_90a")
    diag = exc.value.diagnostics[0]
    assert diag.message.startswith("tlc build (sm_90a): ") and "refused" in diag.message
    assert diag.loc is not None and diag.loc.line > 0 and diag.loc.file.endswith("mha_fwd.tl")
