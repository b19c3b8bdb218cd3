"""Compiled-kernel cache: an in-process dispatch dict in front of an on-disk cubin cache.

Key = sha256 of a canonical encoding (`canonical`: typed and length-prefixed, so two different inputs
never share a key) of tlc's source hash, the emitted source, NVRTC version, arch and options. Writes are atomic
(temp file + os.replace); an entry that fails to read back is rebuilt; `entry_lock` keeps two
processes from compiling one key. A build index maps a build's inputs (TL text, defines, arch) to
its cubin key and kernel IR, so a warm start skips lowering. `TLC_CACHE_DIR` (default ~/.cache/tlc),
`TLC_ALWAYS_COMPILE=1` bypasses both levels, `TLC_DUMP_DIR` receives .cu/.cubin/.log.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import pickle
import tempfile
from pathlib import Path
from typing import Any, Mapping

import tlc
from tlc.backend_cute.lock import file_lock

_MAGIC = b"TLCCUBIN1\n"
_MEMORY: dict[str, tuple[bytes, dict]] = {}


@functools.lru_cache(maxsize=1)
def tlc_source_hash() -> str:
    """Hash of tlc's own Python sources and templates: a compiler change invalidates the cache."""
    root = Path(tlc.__file__).parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.suffix in (".py", ".cuh", ".lark") and "__pycache__" not in path.parts:
            h.update(str(path.relative_to(root)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


def canonical(value: Any) -> bytes:
    """An unambiguous byte encoding of nested data: None, bool, int, str, bytes, lists or tuples, and
    mappings with str keys (in sorted order). Each value is a type letter, then its length or count,
    then its parts, so no two different values share an encoding, whatever bytes their strings hold
    (NUL, '=', newlines)."""
    out = bytearray()
    _encode(value, out)
    return bytes(out)


def _encode(value: Any, out: bytearray) -> None:
    if value is None:
        out += b"N"
    elif isinstance(value, bool):
        out += b"T" if value else b"F"
    elif isinstance(value, int):
        out += b"i%x;" % value
    elif isinstance(value, str):
        data = value.encode("utf-8", "surrogatepass")
        out += b"s%d:" % len(data) + data
    elif isinstance(value, (bytes, bytearray)):
        out += b"b%d:" % len(value) + value
    elif isinstance(value, (list, tuple)):
        out += b"l%d:" % len(value)
        for item in value:
            _encode(item, out)
    elif isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
        out += b"d%d:" % len(value)
        for k in sorted(value):
            _encode(k, out)
            _encode(value[k], out)
    else:
        raise TypeError(f"cache keys hold plain data, not {type(value).__name__}")


def _digest(kind: str, inputs: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical({"kind": kind, "tlc": tlc_source_hash(), "inputs": inputs})).hexdigest()


def cache_key(source: str, arch: str, options: list[str], nvrtc_version: str) -> str:
    """Key of a cubin: everything NVRTC's output depends on."""
    return _digest("cubin", {"source": source, "arch": arch, "options": list(options), "nvrtc": nvrtc_version})


def cache_dir() -> Path:
    return Path(os.environ.get("TLC_CACHE_DIR") or Path.home() / ".cache" / "tlc")


def always_compile() -> bool:
    return os.environ.get("TLC_ALWAYS_COMPILE", "") not in ("", "0")


def atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _entry_path(key: str) -> Path:
    return cache_dir() / key[:2] / f"{key}.cubin"


# Header fields and the types a reader relies on; an entry with another type in any of them is a miss.
_FIELDS: dict[str, type | tuple[type, ...]] = {
    "cache_key": str, "cubin_bytes": int, "cubin_sha256": str, "program": str, "arch": str, "schema": str,
    "schema_version": int, "compile_seconds": (int, float), "ptxas": dict, "nvrtc_options": list,
    "kernels": list, "abi": dict, "versions": dict, "nvrtc_phases_ms": dict, "ptx_bytes": int,
}
_REQUIRED = ("cache_key", "cubin_bytes", "cubin_sha256")


def _read_entry(blob: bytes, key: str) -> tuple[bytes, dict]:
    """(cubin, header) of an entry written by `store` for `key`; ValueError for anything else."""
    if not blob.startswith(_MAGIC):
        raise ValueError("bad magic")
    head, newline, cubin = blob[len(_MAGIC):].partition(b"\n")
    if not newline:
        raise ValueError("truncated header")
    meta = json.loads(head)
    if not isinstance(meta, dict) or any(f not in meta for f in _REQUIRED):
        raise ValueError("not an entry header")
    for field, types in _FIELDS.items():
        value = meta.get(field)
        if field in meta and (not isinstance(value, types) or isinstance(value, bool)):
            raise ValueError(f"field {field} has type {type(value).__name__}")
    if meta["cache_key"] != key:
        raise ValueError("another key's entry")
    if len(cubin) != meta["cubin_bytes"] or hashlib.sha256(cubin).hexdigest() != meta["cubin_sha256"]:
        raise ValueError("checksum mismatch")
    return cubin, meta


def lookup(key: str) -> tuple[bytes, dict] | None:
    if always_compile():
        return None
    if key in _MEMORY:
        return _MEMORY[key]
    try:
        blob = _entry_path(key).read_bytes()
    except OSError:
        return None
    try:
        cubin, meta = _read_entry(blob, key)
    except (ValueError, RecursionError):  # json's errors are ValueErrors (undecodable bytes too)
        return None  # unreadable or not this key: the caller recompiles and store() overwrites it
    _MEMORY[key] = (cubin, meta)
    return cubin, meta


def store(key: str, cubin: bytes, meta: dict) -> None:
    meta = dict(meta, cache_key=key, cubin_bytes=len(cubin), cubin_sha256=hashlib.sha256(cubin).hexdigest())
    _MEMORY[key] = (cubin, meta)
    try:
        atomic_write(_entry_path(key), _MAGIC + json.dumps(meta, sort_keys=True).encode() + b"\n" + cubin)
    except OSError:
        pass  # a read-only cache still works in process


def dump(name: str, files: dict[str, bytes | str]) -> None:
    """Write debugging artifacts under TLC_DUMP_DIR, when set."""
    where = os.environ.get("TLC_DUMP_DIR")
    if not where:
        return
    for suffix, data in files.items():
        atomic_write(Path(where) / f"{name}{suffix}", data.encode() if isinstance(data, str) else data)


def entry_lock(key: str, on_wait=None):
    """Context manager: the cross-process lock beside `key`'s entry (tlc.backend_cute.lock)."""
    return file_lock(_entry_path(key).with_suffix(".lock"), on_wait=on_wait)


# ---------------------------------------------------------------------- build index
_INDEX_MAGIC = b"TLCBUILD1\n"


def build_key(inputs: Mapping[str, Any]) -> str:
    """Key of a build's inputs, by name; the caller passes everything that decides the emitted source."""
    return _digest("build", inputs)


def _index_path(key: str) -> Path:
    return cache_dir() / key[:2] / f"{key}.build"


def lookup_build(key: str) -> dict | None:
    """The record `store_build` wrote for `key`, or None. The record is a pickle of tlc's own
    kernel-IR objects, read only from the user's cache folder (as the cubins it points at are)."""
    if always_compile():
        return None
    try:
        blob = _index_path(key).read_bytes()
    except OSError:
        return None
    if not blob.startswith(_INDEX_MAGIC):
        return None
    try:
        record = pickle.loads(blob[len(_INDEX_MAGIC):])
    except Exception:  # a torn or foreign file, or classes renamed since: rebuild
        return None
    return record if isinstance(record, dict) and record.get("build_key") == key else None


def store_build(key: str, record: dict) -> None:
    try:
        blob = _INDEX_MAGIC + pickle.dumps(dict(record, build_key=key), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
        return  # an unpicklable program just misses the index: the cubin cache still works
    try:
        atomic_write(_index_path(key), blob)
    except OSError:
        pass


def clear_memory() -> None:
    _MEMORY.clear()
