"""The build keys (the disk build index and the in-process dispatch) include the environment switches
that change what the lowering emits, so a warm cache never hands back the other variant's kernel."""
from __future__ import annotations

from tlc import runtime


def test_fold_partitions_switch_changes_the_build_key(monkeypatch) -> None:
    args = (b"Param BM = 64\n", "x.tl", {"BM": "64"}, "sm_90", False)
    monkeypatch.setenv("TLC_FOLD_PARTITIONS", "0")
    off = runtime.build_inputs_key(*args)
    monkeypatch.delenv("TLC_FOLD_PARTITIONS", raising=False)
    on = runtime.build_inputs_key(*args)
    assert on != off and "TLC_FOLD_PARTITIONS" in runtime.LOWERING_SWITCHES
    for same in ("", "1", " 1", "wgmma"):   # the pass is on for each: one cache entry
        monkeypatch.setenv("TLC_FOLD_PARTITIONS", same)
        assert runtime.build_inputs_key(*args) == on
    monkeypatch.setenv("TLC_FOLD_PARTITIONS", "no-wgmma")   # folds less on sm_90a: its own entry
    assert runtime.build_inputs_key(*args) not in (on, off)
