"""The compile path's cache behaviour without NVRTC (a fake compile_cubin): the cross-process lock
beside a cache entry (one compile for two processes, a timeout that says so, no hang on a dead
holder's lock), progress lines on stderr, and the build index that lets a warm start skip lowering."""
from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from tests.unit.two_processes import FORK, race
import tlc.backend_cute.compile as compile_mod
from tlc.backend_cute import cache
from tlc.backend_cute.lock import file_lock
from tlc.backend_cute.nvrtc import NvrtcResult, parse_time_table
from tlc.builder import lower_to_kernel_ir
from tlc.diagnostics import TlcError

MHA = Path(__file__).resolve().parents[2] / "specs" / "mha_fwd.tl"


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TLC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TLC_ALWAYS_COMPILE", raising=False)
    monkeypatch.delenv("TLC_QUIET", raising=False)
    cache.clear_memory()
    yield tmp_path / "cache"
    cache.clear_memory()


@pytest.fixture(scope="module")
def program():
    state, _ = lower_to_kernel_ir(MHA.read_bytes(), str(MHA), "sm_90", {"HeadDim": "64"}, name="mha_fwd")
    return state.kir


def _fake_nvrtc(counter: Path | None = None, seconds: float = 0.0):
    def compile_cubin(source, arch, name="kernel.cu", extra_options=()):
        if counter is not None:
            with open(counter, "a") as f:
                f.write(f"{os.getpid()}\n")
        time.sleep(seconds)
        return NvrtcResult(b"\x7fELF fake " + arch.encode(), "", seconds, [f"-arch={arch}"])
    return compile_cubin


# ---------------------------------------------------------------------- the lock
def _hold(path: str, ready, release, die: bool) -> None:
    with file_lock(Path(path)):
        ready.set()
        if die:
            os._exit(0)  # the kernel drops a dead process's flock; the file stays behind
        release.wait(30)


def test_lock_is_released_and_removed(tmp_path) -> None:
    lock = tmp_path / "made" / "k.lock"
    with file_lock(lock):
        assert lock.read_text() == str(os.getpid())
        assert stat.S_IMODE(lock.stat().st_mode) == 0o600 and stat.S_IMODE(lock.parent.stat().st_mode) == 0o700
    assert not lock.exists()
    with file_lock(lock, timeout=1):  # taken again at once
        pass


def test_lock_timeout_is_one_line_naming_the_holder(tmp_path) -> None:
    lock = tmp_path / "k.lock"
    ready, release = FORK.Event(), FORK.Event()
    holder = FORK.Process(target=_hold, args=(str(lock), ready, release, False))
    holder.start()
    try:
        assert ready.wait(30)
        start = time.monotonic()
        with pytest.raises(TlcError) as info:
            with file_lock(lock, timeout=0.3):
                pass
        assert time.monotonic() - start < 5
        message = info.value.render()
        assert "\n" not in message.strip() and "timed out" in message
        assert f"process {holder.pid}" in message and "TLC_LOCK_TIMEOUT" in message
    finally:
        release.set()
        holder.join(30)


def test_a_dead_holders_lock_does_not_block(tmp_path) -> None:
    lock = tmp_path / "k.lock"
    ready, release = FORK.Event(), FORK.Event()
    holder = FORK.Process(target=_hold, args=(str(lock), ready, release, True))
    holder.start()
    holder.join(30)
    assert ready.is_set() and lock.exists()  # left behind, as after a crash
    start = time.monotonic()
    with file_lock(lock, timeout=5):
        pass
    assert time.monotonic() - start < 1
    lock.write_text("999999999")  # a stale file naming a process that is gone, with no flock on it
    with file_lock(lock, timeout=5):
        pass


def _compile_in_child(program, cache_dir: str, counter: str, barrier, results) -> None:
    os.environ["TLC_CACHE_DIR"] = cache_dir
    os.environ["TLC_QUIET"] = "1"
    compile_mod.compile_cubin = _fake_nvrtc(Path(counter), seconds=1.0)
    cache.clear_memory()
    barrier.wait(30)
    compiled = compile_mod.compile_kir(program, "sm_90")
    results.put((compiled.cached, compiled.cubin))


def test_two_processes_compile_one_key_once(tmp_cache, tmp_path, program) -> None:
    counter = tmp_path / "nvrtc-runs"
    got = race(_compile_in_child, program, str(tmp_cache), str(counter), timeout=60)
    assert len(counter.read_text().split()) == 1  # one NVRTC run between them
    assert sorted(cached for cached, _ in got) == [False, True]
    assert got[0][1] == got[1][1] == b"\x7fELF fake sm_90"
    assert not list(tmp_cache.rglob("*.lock"))


# ---------------------------------------------------------------------- progress on stderr
def test_progress_lines_for_slow_compiles_only(tmp_cache, program, monkeypatch, capfd) -> None:
    monkeypatch.setattr(compile_mod, "compile_cubin", _fake_nvrtc(seconds=0.3))
    monkeypatch.setattr(compile_mod, "PROGRESS_AFTER_S", 0.05)
    with compile_mod.progress_label("mha_fwd HeadDim=64"):
        compile_mod.compile_kir(program, "sm_90")
    err = capfd.readouterr().err.splitlines()
    assert err[0] == "tlc: compiling mha_fwd HeadDim=64 for sm_90 (first use of this shape; cached afterwards)..."
    assert err[1].startswith("tlc: compiled mha_fwd HeadDim=64 for sm_90 in ") and len(err) == 2
    assert compile_mod.compile_kir(program, "sm_90").cached
    assert capfd.readouterr().err == ""  # a cache hit says nothing
    monkeypatch.setenv("TLC_ALWAYS_COMPILE", "1")
    monkeypatch.setenv("TLC_QUIET", "1")
    assert not compile_mod.compile_kir(program, "sm_90").cached
    assert capfd.readouterr().err == ""


def test_fast_compiles_print_nothing(tmp_cache, program, monkeypatch, capfd) -> None:
    monkeypatch.setattr(compile_mod, "compile_cubin", _fake_nvrtc(seconds=0.0))
    compile_mod.compile_kir(program, "sm_90")
    assert capfd.readouterr().err == ""


# ---------------------------------------------------------------------- build index
def test_warm_start_skips_lowering(tmp_cache, monkeypatch) -> None:
    import tlc.builder
    from tlc.runtime import compile_spec

    monkeypatch.setattr(compile_mod, "compile_cubin", _fake_nvrtc())
    cold, abi = compile_spec(MHA, arch="sm_90", defines={"HeadDim": 64, "Causal": True})
    assert not cold.cached and {"lower", "emit", "nvrtc"} <= set(cold.timings)
    cache.clear_memory()  # as a fresh process: only the disk

    def no_lowering(*args, **kw):
        raise AssertionError("a warm start lowered the program again")
    monkeypatch.setattr(tlc.builder, "lower_to_kernel_ir", no_lowering)
    warm, warm_abi = compile_spec(MHA, arch="sm_90", defines={"HeadDim": "64", "Causal": "true"})
    assert warm.cached and set(warm.timings) == {"index"}
    assert warm.cubin == cold.cubin and warm.source == cold.source and warm_abi == abi
    assert warm.program.kernels()[0].name == cold.program.kernels()[0].name
    monkeypatch.undo()
    monkeypatch.setenv("TLC_CACHE_DIR", str(tmp_cache))
    monkeypatch.setattr(compile_mod, "compile_cubin", _fake_nvrtc())
    other, _ = compile_spec(MHA, arch="sm_80", defines={"HeadDim": 64, "Causal": True})
    assert not other.cached  # another arch is another entry


def test_index_pointing_at_a_missing_cubin_rebuilds(tmp_cache, monkeypatch) -> None:
    from tlc.runtime import compile_spec

    monkeypatch.setattr(compile_mod, "compile_cubin", _fake_nvrtc())
    compile_spec(MHA, arch="sm_90", defines={"HeadDim": 64})
    for entry in tmp_cache.rglob("*.cubin"):
        entry.unlink()
    cache.clear_memory()
    again, _ = compile_spec(MHA, arch="sm_90", defines={"HeadDim": 64})
    assert not again.cached
    for index in tmp_cache.rglob("*.build"):
        index.write_bytes(cache._INDEX_MAGIC + b"garbage")
    cache.clear_memory()
    assert compile_spec(MHA, arch="sm_90", defines={"HeadDim": 64})[0].cached  # via lowering + cubin cache


def test_nvrtc_time_table() -> None:
    table = "File name, phase name, metric, unit\nk.cu, CUDA C++ Frontend, 47, ms\nk.cu, NVVM Optimizer, 18, ms\n" \
            "k.cu, PTX Translation, 18, ms\n"
    assert parse_time_table(table, 0.1) == {"CUDA C++ Frontend": 47.0, "NVVM Optimizer": 18.0,
                                            "PTX Translation": 18.0, "ptxas and rest": 17.0}
    assert parse_time_table("", 1.0) == {}
