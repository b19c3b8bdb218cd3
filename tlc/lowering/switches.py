"""Environment switches that change what the lowering emits, read in one place: the pass that obeys
one and the build keys (tlc.runtime) that must tell its variants apart use the same reading."""
from __future__ import annotations

import os

LOWERING_SWITCHES = ("TLC_FOLD_PARTITIONS",)


def _fold_mode() -> str:
    value = os.environ.get("TLC_FOLD_PARTITIONS", "1").strip().lower()
    return "off" if value == "0" else "wgmma" if value == "wgmma" else "on"


def fold_partitions_enabled() -> bool:
    """fold-partitions is on unless TLC_FOLD_PARTITIONS=0 (unset, '' and '1' all mean on)."""
    return _fold_mode() != "off"


def fold_wgmma_enabled() -> bool:
    """TLC_FOLD_PARTITIONS=wgmma: on sm_90a also the copy matched to the wgmma accumulator (checked
    against CuTe by NVRTC, not yet run on a GPU; docs/compile_time.md)."""
    return _fold_mode() == "wgmma"


def switches_key() -> str:
    """The switches as the lowering reads them: one spelling per variant, for the build keys."""
    return f"TLC_FOLD_PARTITIONS={_fold_mode()}"
