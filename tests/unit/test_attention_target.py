"""`tlc.attention`'s target choice on Hopper (sm_90a, TLC_ATTENTION_ARCH) and its fallback to the
sm_90 kernel when the sm_90a lowering refuses a head dim (no GPU: device and build are stubbed)."""
from __future__ import annotations

import pytest

from tlc import runtime
from tlc.attention import kernels
from tlc.diagnostics import TlcError, fail


@pytest.mark.parametrize("device,env,want", [("sm_90", None, "sm_90a"), ("sm_90", "sm_90", "sm_90"),
                                             ("sm_80", None, "sm_80"), ("sm_89", "sm_90a", "sm_89")])
def test_target_per_device(monkeypatch, device, env, want) -> None:
    monkeypatch.setattr(runtime, "device_arch", lambda device=None: device_name)
    device_name = device
    if env is None:
        monkeypatch.delenv("TLC_ATTENTION_ARCH", raising=False)
    else:
        monkeypatch.setenv("TLC_ATTENTION_ARCH", env)
    assert kernels.attention_target() == want


def test_a_bad_override_is_one_line(monkeypatch) -> None:
    monkeypatch.setattr(runtime, "device_arch", lambda device=None: "sm_90")
    monkeypatch.setenv("TLC_ATTENTION_ARCH", "sm_100")
    with pytest.raises(TlcError, match="TLC_ATTENTION_ARCH='sm_100': for a Hopper GPU set sm_90a .*or sm_90"):
        kernels.attention_target()


def test_refused_sm90a_falls_back_to_sm90_with_its_tiles(monkeypatch) -> None:
    calls = []

    def fake_build(spec, *, arch, defines):
        calls.append((arch, defines["Warps"], defines["BN"]))
        if arch == "sm_90a":
            raise fail("shared tile 'Q' is 128×96; width must be a multiple of 64")
        return "kernel"
    monkeypatch.setattr(runtime, "build", fake_build)
    with pytest.warns(UserWarning, match=r"no sm_90a kernel for d=96/96 .*multiple of 64.*using the sm_90 kernel"):
        assert kernels.build_attention("bf16", 96, 96, False, "sm_90a") == "kernel"
    assert [c[0] for c in calls] == ["sm_90a", "sm_90"] and calls[0][1] == 8 and calls[1][1] == 4


def test_other_targets_do_not_fall_back(monkeypatch) -> None:
    monkeypatch.setattr(runtime, "build", lambda spec, *, arch, defines: (_ for _ in ()).throw(fail("broken")))
    with pytest.raises(TlcError, match="broken"):
        kernels.build_attention("bf16", 64, 64, True, "sm_80")


STATIC, DYNAMIC = {"Persistent": True, "StaticTiles": True}, {"Persistent": True}


@pytest.mark.parametrize("causal,d,seq_k,want", [
    (False, 64, 1, STATIC), (False, 64, 4096, STATIC), (False, 40, 4096, STATIC), (False, 64, 4097, {}),
    (False, 128, 2048, STATIC), (False, 96, 2048, STATIC), (False, 128, 2049, {}), (False, 128, 4096, {}),
    (False, 256, 2048, STATIC), (False, 224, 2049, {}),
    (True, 64, 1024, DYNAMIC), (True, 128, 1024, DYNAMIC), (True, 128, 1025, {}), (True, 256, 1, {}),
    (True, 128, None, {}), (False, 64, None, {})])
def test_short_key_sequences_take_the_persistent_schedule_on_hopper(causal, d, seq_k, want) -> None:
    from tlc.attention.tuning import default_schedule

    def knobs(d, dv, arch="sm_90a"):
        return {k: v for k, v in default_schedule(d, dv, arch, causal, seq_k).items() if k in ("Persistent", "StaticTiles")}
    assert knobs(d, d) == want
    assert knobs(d, d, "sm_90") == {}   # the mma.sync kernels: never
    assert knobs(192, 128) == {} and knobs(160, 160) == {}   # MLA prefill's pair and the 192 width: never
    assert kernels.attention_spec("bf16", d, d, causal, "sm_90a", seq_k)[1].get("Persistent", False) == bool(want)


def test_widths_outside_the_short_keys_table_are_never_short_even_with_no_keys() -> None:
    from tlc.attention.tuning import default_schedule, short_keys

    for seq_k in (0, 1):
        assert not short_keys("sm_90a", 160, 160, False, seq_k) and not short_keys("sm_90a", 256, 256, True, seq_k)
        assert short_keys("sm_90a", 128, 128, True, seq_k) and short_keys("sm_90a", 256, 256, False, seq_k)
    assert default_schedule(256, 256, "sm_90a", True, 0) == {"L2Sections": True, "PrefetchNext": True}


def test_each_schedule_is_a_fresh_dict() -> None:
    from tlc.attention import tuning

    for args in ((64, 64, "sm_90a", True, 1), (128, 128, "sm_90a", False, 1), (192, 128, "sm_90a"), (64, 64, "sm_90"),
                 (128, 128, "sm_90a", False, 8192)):
        tuning.default_schedule(*args)["Stages"] = 99
        assert 99 not in (v for table in (tuning.SM90A_SHORT_KEYS[False][1], tuning.SM90A_SHORT_KEYS[True][1],
                                          tuning.SM90A_ONE_TILE_SCHEDULE, *tuning.SM90A_SCHEDULE.values(),
                                          *tuning.SM90A_CAUSAL_SCHEDULE.values(), *tuning.DEFAULT_SCHEDULE.values())
                          for v in table.values())


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d,dv", [(64, 64), (128, 128), (256, 256), (192, 128), (40, 40)])
def test_one_tile_hopper_kernels_prefetch_the_next_wave_and_persistent_ones_do_not(d, dv, causal) -> None:
    from tlc.attention.tuning import default_schedule, short_keys

    for seq_k in (None, 1, 1024, 4096, 4097, 16384):
        got = default_schedule(d, dv, "sm_90a", causal, seq_k)
        assert got.get("PrefetchNext", False) == (not got.get("Persistent", False)), (seq_k, got)
        assert got.get("Persistent", False) == short_keys("sm_90a", d, dv, causal, seq_k)
        assert "PrefetchNext" not in default_schedule(d, dv, "sm_90", causal, seq_k)


def test_the_dispatch_table_keys_the_key_length_class(monkeypatch) -> None:
    """Two calls whose key lengths fall in different classes get two kernels; lengths in one class share one."""
    import torch

    built = []
    monkeypatch.setattr(kernels, "attention_target", lambda device=None: "sm_90a")
    monkeypatch.setattr(kernels, "build_attention", lambda *a: built.append(a) or f"kernel{len(built)}")
    monkeypatch.setattr(kernels, "_ATTENTION", {})
    q = torch.empty(1, 2, 8, 128, dtype=torch.bfloat16)
    got = [kernels.attention_kernel(q, 128, False, sk) for sk in (1000, 2048, 4096, 100000)]
    assert got == ["kernel1", "kernel1", "kernel2", "kernel2"]
    assert [a[-1] for a in built] == [1000, 4096]
    assert kernels.attention_kernel(q, 128, True, 1000) == "kernel3"
    assert kernels.attention_kernel(q, 128, True, 2000) == "kernel4"
