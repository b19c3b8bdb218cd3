"""`tlc.attention`'s target choice on Hopper (sm_90a, TLC_ATTENTION_ARCH) and its fallback to the
sm_90 kernel when the sm_90a lowering refuses a head dim (no GPU: device and build are stubbed)."""
from __future__ import annotations

import pytest

import tlc.runtime as rt
from tlc.diagnostics import TlcError, fail


@pytest.mark.parametrize("device,env,want", [("sm_90", None, "sm_90a"), ("sm_90", "sm_90", "sm_90"),
                                             ("sm_80", None, "sm_80"), ("sm_89", "sm_90a", "sm_89")])
def test_target_per_device(monkeypatch, device, env, want) -> None:
    monkeypatch.setattr(rt, "device_arch", lambda device=None: device_name)
    device_name = device
    if env is None:
        monkeypatch.delenv("TLC_ATTENTION_ARCH", raising=False)
    else:
        monkeypatch.setenv("TLC_ATTENTION_ARCH", env)
    assert rt.attention_target() == want


def test_a_bad_override_is_one_line(monkeypatch) -> None:
    monkeypatch.setattr(rt, "device_arch", lambda device=None: "sm_90")
    monkeypatch.setenv("TLC_ATTENTION_ARCH", "sm_100")
    with pytest.raises(TlcError, match="TLC_ATTENTION_ARCH='sm_100': for a Hopper GPU set sm_90a .*or sm_90"):
        rt.attention_target()


def test_refused_sm90a_falls_back_to_sm90_with_its_tiles(monkeypatch) -> None:
    calls = []

    def fake_build(spec, *, arch, defines):
        calls.append((arch, defines["Warps"], defines["BN"]))
        if arch == "sm_90a":
            raise fail("shared tile 'Q' is 128×96; width must be a multiple of 64")
        return "kernel"
    monkeypatch.setattr(rt, "build", fake_build)
    with pytest.warns(UserWarning, match=r"no sm_90a kernel for d=96/96 .*multiple of 64.*using the sm_90 kernel"):
        assert rt.build_attention("bf16", 96, 96, False, "sm_90a") == "kernel"
    assert [c[0] for c in calls] == ["sm_90a", "sm_90"] and calls[0][1] == 8 and calls[1][1] == 4


def test_other_targets_do_not_fall_back(monkeypatch) -> None:
    monkeypatch.setattr(rt, "build", lambda spec, *, arch, defines: (_ for _ in ()).throw(fail("broken")))
    with pytest.raises(TlcError, match="broken"):
        rt.build_attention("bf16", 64, 64, True, "sm_80")
