"""Environment switches that change what the lowering emits, read in one place: the pass that obeys
one and the build keys (tlc.runtime) that must tell its variants apart use the same reading."""
from __future__ import annotations

import os

LOWERING_SWITCHES = ("TLC_FOLD_PARTITIONS",)


def _fold_mode() -> str:
    """'off' (TLC_FOLD_PARTITIONS=0), 'no-wgmma' (=no-wgmma: the sm_90a copy matched to the wgmma
    accumulator stays CuTe's, for A/B runs) or 'all' (anything else: unset, '', '1', 'wgmma')."""
    value = os.environ.get("TLC_FOLD_PARTITIONS", "1").strip().lower()
    return {"0": "off", "no-wgmma": "no-wgmma"}.get(value, "all")


def fold_partitions_enabled() -> bool:
    """fold-partitions is on unless TLC_FOLD_PARTITIONS=0."""
    return _fold_mode() != "off"


def fold_wgmma_enabled() -> bool:
    """On sm_90a also the copy matched to the wgmma accumulator (checked against CuTe by NVRTC and run
    on an H200; docs/compile_time.md); TLC_FOLD_PARTITIONS=no-wgmma leaves it to CuTe."""
    return _fold_mode() == "all"


def switches_key() -> str:
    """The switches as the lowering reads them: one spelling per variant, for the build keys."""
    return f"TLC_FOLD_PARTITIONS={_fold_mode()}"
