"""The cache is private to its user: folders tlc creates are 0700 and entries 0600; an entry someone else
could have written (another user's file, a group- or world-writable one, a link, a FIFO) is a miss; a cache
folder of another user or one anyone can write is not used at all, with one line on stderr saying why."""
from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

import tlc.backend_cute.compile as compile_mod
from tlc.backend_cute import cache
from tlc.backend_cute.nvrtc import NvrtcResult
from tlc.runtime import compile_spec

MHA = Path(__file__).resolve().parents[2] / "specs" / "mha_fwd.tl"
AS_ROOT = pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                             reason="giving a file to another user needs root")
NOBODY = 65534


@pytest.fixture
def fake_nvrtc(monkeypatch):
    monkeypatch.delenv("TLC_ALWAYS_COMPILE", raising=False)
    monkeypatch.setattr(compile_mod, "compile_cubin", lambda source, arch, name="k.cu", extra_options=():
                        NvrtcResult(b"\x7fELF fake " + arch.encode(), "", 0.0, [f"-arch={arch}"]))
    monkeypatch.setattr(cache, "_WARNED", set())
    cache.clear_memory()
    yield
    cache.clear_memory()


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch, fake_nvrtc):
    monkeypatch.setenv("TLC_CACHE_DIR", str(tmp_path / "cache"))
    compile_spec(MHA, arch="sm_90", defines={"HeadDim": 64})
    return tmp_path / "cache"


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _served() -> tuple[bool, bool]:
    """(index hit, cubin hit) of a fresh process's build of the fixture's kernel."""
    cache.clear_memory()
    compiled, _ = compile_spec(MHA, arch="sm_90", defines={"HeadDim": 64})
    return set(compiled.timings) == {"index"}, compiled.cached


def test_folders_are_0700_and_entries_0600_whatever_the_umask(tmp_path, monkeypatch, fake_nvrtc) -> None:
    monkeypatch.setenv("TLC_CACHE_DIR", str(tmp_path / "made" / "by" / "tlc"))
    old = os.umask(0o002)
    try:
        compile_spec(MHA, arch="sm_90", defines={"HeadDim": 64})
    finally:
        os.umask(old)
    folders = [p for p in (tmp_path / "made").rglob("*") if p.is_dir()] + [tmp_path / "made"]
    files = [p for p in (tmp_path / "made").rglob("*") if p.is_file()]
    assert len(folders) >= 4 and {_mode(p) for p in folders} == {0o700}
    assert {p.suffix for p in files} == {".cubin", ".build"} and {_mode(p) for p in files} == {0o600}
    assert _served() == (True, True)


@pytest.mark.parametrize("suffix", [".build", ".cubin"])
@pytest.mark.parametrize("mode", [0o620, 0o602, 0o666], ids=["g+w", "o+w", "a+w"])
def test_an_entry_others_can_write_is_a_miss_and_is_rewritten_private(tmp_cache, suffix, mode) -> None:
    (entry,) = tmp_cache.rglob(f"*{suffix}")
    entry.chmod(mode)
    assert _served() == ((False, True) if suffix == ".build" else (False, False))
    assert _mode(entry) == 0o600 and _served() == (True, True)


@pytest.mark.parametrize("suffix", [".build", ".cubin"])
def test_a_linked_entry_is_a_miss(tmp_cache, suffix) -> None:
    (entry,) = tmp_cache.rglob(f"*{suffix}")
    elsewhere = tmp_cache.parent / f"elsewhere{suffix}"
    entry.rename(elsewhere)
    entry.symlink_to(elsewhere)  # a good entry of the user's own, reached through a link
    assert not _served()[0]


def test_a_fifo_entry_is_a_miss_without_waiting(tmp_cache) -> None:
    (entry,) = tmp_cache.rglob("*.build")
    entry.unlink()
    os.mkfifo(entry, 0o600)
    got = []
    reader = threading.Thread(target=lambda: got.append(cache.lookup_build(entry.stem)), daemon=True)
    reader.start()
    reader.join(10)
    blocked = reader.is_alive()
    if blocked:  # waiting for a writer to open the FIFO: open and close one so the thread ends
        os.close(os.open(entry, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(10)
    assert not blocked and got == [None]


@AS_ROOT
@pytest.mark.parametrize("suffix", [".build", ".cubin"])
def test_another_users_entry_is_a_miss(tmp_cache, suffix) -> None:
    (entry,) = tmp_cache.rglob(f"*{suffix}")
    os.chown(entry, NOBODY, NOBODY)
    assert not _served()[0 if suffix == ".build" else 1]
    assert os.stat(entry).st_uid == 0 and _served() == (True, True)  # the rebuild wrote its own


def test_a_cache_folder_anyone_can_write_is_not_used(tmp_cache, capfd) -> None:
    before = {p: p.read_bytes() for p in tmp_cache.rglob("*") if p.is_file()}
    tmp_cache.chmod(0o777)
    assert _served() == (False, False)
    assert _served() == (False, False)
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"tlc: warning: not using the kernel cache in {tmp_cache}: ")
    assert "anyone can write to it (mode 777)" in err and "TLC_CACHE_DIR" in err
    assert {p: p.read_bytes() for p in tmp_cache.rglob("*") if p.is_file()} == before  # nothing written there
    tmp_cache.chmod(0o700)
    assert _served() == (True, True)


def test_an_entry_folder_anyone_can_write_is_not_used(tmp_cache, capfd) -> None:
    (entry,) = tmp_cache.rglob("*.build")
    entry.parent.chmod(0o1777)
    assert not _served()[0]
    assert f"not using the kernel cache in {entry.parent}: anyone can write" in capfd.readouterr().err


def test_a_group_writable_folder_of_ones_own_is_used(tmp_cache, capfd) -> None:
    """Umask 002 (a group per user) makes folders group-writable: still the user's cache."""
    for folder in [tmp_cache, *(p for p in tmp_cache.iterdir() if p.is_dir())]:
        folder.chmod(0o770)
    assert _served() == (True, True) and capfd.readouterr().err == ""


@AS_ROOT
def test_another_users_cache_folder_is_not_used(tmp_cache, capfd) -> None:
    os.chown(tmp_cache, NOBODY, NOBODY)
    assert _served() == (False, False)
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and f"belongs to user id {NOBODY}, not to you" in err


def test_a_cache_folder_name_with_control_bytes_is_shown_escaped(tmp_path, monkeypatch, fake_nvrtc, capfd) -> None:
    folder = tmp_path / "evil\x1b[2J"
    folder.mkdir(mode=0o777)
    folder.chmod(0o777)
    monkeypatch.setenv("TLC_CACHE_DIR", str(folder))
    assert cache.lookup_build("ab" * 32) is None
    err = capfd.readouterr().err
    assert "\x1b" not in err and "evil\\x1b[2J" in err and err.count("\n") == 1
