"""The build keys (the disk build index and the in-process dispatch) include the environment switches
that change what the lowering emits, so a warm cache never hands back the other variant's kernel."""
from __future__ import annotations

from tlc import runtime


def test_fold_partitions_switch_changes_the_build_key(monkeypatch) -> None:
    args = (b"Param BM = 64\n", "x.tl", {"BM": "64"}, "sm_90", False)
    monkeypatch.delenv("TLC_FOLD_PARTITIONS", raising=False)
    off = runtime._build_inputs_key(*args)
    monkeypatch.setenv("TLC_FOLD_PARTITIONS", "1")
    on = runtime._build_inputs_key(*args)
    assert on != off and "TLC_FOLD_PARTITIONS" in runtime.LOWERING_SWITCHES
    monkeypatch.setenv("TLC_FOLD_PARTITIONS", "")
    assert runtime._build_inputs_key(*args) == off   # set but empty is off, as unset
