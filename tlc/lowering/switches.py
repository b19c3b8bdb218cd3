"""Environment switches that change what the lowering emits, read in one place: the pass that obeys
one and the build keys (tlc.runtime) that must tell its variants apart use the same reading."""
from __future__ import annotations

import os

LOWERING_SWITCHES = ("TLC_FOLD_PARTITIONS",)


def fold_partitions_enabled() -> bool:
    """fold-partitions is on unless TLC_FOLD_PARTITIONS=0 (unset, '' and '1' all mean on)."""
    return os.environ.get("TLC_FOLD_PARTITIONS", "1").strip() != "0"


def switches_key() -> str:
    """The switches as the lowering reads them: one spelling per variant, for the build keys."""
    return f"TLC_FOLD_PARTITIONS={'on' if fold_partitions_enabled() else 'off'}"
