"""Any unreadable kernel-cache entry is a miss (and is overwritten), never an internal error."""
from __future__ import annotations

import hashlib
import json

import pytest

from tlc.backend_cute import cache

KEY = "ab" + "0" * 62
CUBIN = b"\x7fELF fake cubin"


def _write(tmp_path, monkeypatch, header: bytes, body: bytes = CUBIN) -> None:
    monkeypatch.setenv("TLC_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TLC_ALWAYS_COMPILE", raising=False)
    cache.clear_memory()
    path = tmp_path / KEY[:2] / f"{KEY}.cubin"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(cache._MAGIC + header + b"\n" + body)


def _good(**extra) -> bytes:
    meta = {"cubin_bytes": len(CUBIN), "cubin_sha256": hashlib.sha256(CUBIN).hexdigest(), "cache_key": KEY, **extra}
    return json.dumps(meta).encode()


def test_a_good_entry_is_a_hit(tmp_path, monkeypatch) -> None:
    _write(tmp_path, monkeypatch, _good())
    assert cache.lookup(KEY) == (CUBIN, json.loads(_good()))


@pytest.mark.parametrize("header", [b"[]", b"3", b'"x"', b"null", b"{", b"\xff\xfe", b'{"cubin_bytes": "many"}',
                                    b'{"cubin_bytes": 15, "cubin_sha256": 7}', b""])
def test_an_unreadable_header_is_a_miss(tmp_path, monkeypatch, header) -> None:
    _write(tmp_path, monkeypatch, header)
    assert cache.lookup(KEY) is None


@pytest.mark.parametrize("field,value", [("cubin_bytes", True), ("cubin_bytes", 15.0), ("cache_key", 3),
                                         ("compile_seconds", "slow"), ("ptxas", []), ("kernels", {}),
                                         ("program", None), ("nvrtc_options", "-O3"), ("versions", [])])
def test_a_field_of_the_wrong_type_is_a_miss(tmp_path, monkeypatch, field, value) -> None:
    meta = json.loads(_good())
    meta[field] = value
    _write(tmp_path, monkeypatch, json.dumps(meta).encode())
    assert cache.lookup(KEY) is None


def test_a_truncated_or_deeply_nested_entry_is_a_miss(tmp_path, monkeypatch) -> None:
    _write(tmp_path, monkeypatch, b"", body=b"")
    (tmp_path / KEY[:2] / f"{KEY}.cubin").write_bytes(cache._MAGIC + _good()[:20])  # no end of header
    assert cache.lookup(KEY) is None
    _write(tmp_path, monkeypatch, _good(), body=CUBIN[:-3])
    assert cache.lookup(KEY) is None
    _write(tmp_path, monkeypatch, b"[" * 100_000)
    assert cache.lookup(KEY) is None


def test_an_entry_without_its_key_is_a_miss(tmp_path, monkeypatch) -> None:
    meta = json.loads(_good())
    del meta["cache_key"]
    _write(tmp_path, monkeypatch, json.dumps(meta).encode())
    assert cache.lookup(KEY) is None


def test_an_entry_for_another_key_is_a_miss(tmp_path, monkeypatch) -> None:
    meta = json.loads(_good())
    meta["cache_key"] = "cd" + "1" * 62
    _write(tmp_path, monkeypatch, json.dumps(meta).encode())
    assert cache.lookup(KEY) is None


def test_a_miss_is_overwritten_by_the_next_store(tmp_path, monkeypatch) -> None:
    _write(tmp_path, monkeypatch, b"[]")
    assert cache.lookup(KEY) is None
    cache.store(KEY, CUBIN, {})  # store() records the key itself
    cache.clear_memory()
    assert cache.lookup(KEY)[0] == CUBIN
