"""Compiled-kernel cache: an in-process dispatch dict in front of an on-disk cubin cache and a build index.

Keys are sha256 of a canonical encoding of every input (`canonical`: typed and length-prefixed, so two
different inputs never share a key). The cubin key covers tlc's source hash, the emitted source, NVRTC
version, arch and options; the build-index key covers a build's inputs (TL text, defines, arch, ...) and
its entry holds the cubin key and the kernel IR as JSON data (`kir_codec`, never pickle), so a warm start
skips lowering. Folders are created 0700, entries written atomically 0600; an entry that is torn, for
another key or format version, or that someone other than the user could have written is a miss and is
rebuilt. `entry_lock` keeps two processes from compiling one key. `TLC_CACHE_DIR` (default
~/.cache/tlc); `TLC_ALWAYS_COMPILE=1` bypasses both levels; `TLC_DUMP_DIR` receives .cu/.cubin/.log.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import stat
import sys
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


def atomic_write(path: Path, data: bytes, mode: int | None = None) -> None:
    """Write `path` whole or not at all, through a fresh temporary file beside it (never a predictable name
    a planted link could redirect); mode 0600 unless `mode` is given."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        if mode is not None:
            os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


# ---------------------------------------------------------------------- folders and entry files
def _private_folder(folder: Path) -> None:
    """Create `folder` and its missing parents mode 0700, so only the user can read or plant entries."""
    missing = []
    while not folder.is_dir():
        missing.append(folder)
        if folder.parent == folder:
            break
        folder = folder.parent
    for path in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)


def _ours(st: os.stat_result) -> bool:
    """Owned by the user (or root): nobody else could have written what it holds."""
    return not hasattr(os, "geteuid") or st.st_uid in (os.geteuid(), 0)


def _folder_problem(folder: Path) -> str | None:
    """Why another user could plant entries in `folder`: it is theirs, or anyone may write to it."""
    try:
        st = os.stat(folder)
    except OSError:
        return None  # absent: nothing to read from it; a store creates it private
    if not _ours(st):
        return f"it belongs to user id {st.st_uid}, not to you"
    if st.st_mode & stat.S_IWOTH:
        return f"anyone can write to it (mode {stat.S_IMODE(st.st_mode):o})"
    return None


_WARNED: set[str] = set()


def _usable(folder: Path) -> bool:
    """Whether the cache may read and write entries in `folder` (an entry's two-letter folder): it and
    the cache folder must be the user's and not writable by everyone (a group-writable folder of the
    user's own passes; the per-file check in `_read_file` still refuses entries others wrote). Says
    once per folder on stderr when it is not: the cache then works as if it were empty."""
    for where in (cache_dir(), folder):
        problem = _folder_problem(where)
        if problem is not None:
            shown = "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in str(where))
            if shown not in _WARNED:
                _WARNED.add(shown)
                print(f"tlc: warning: not using the kernel cache in {shown}: {problem}; set TLC_CACHE_DIR to a "
                      "folder of your own that only you can write", file=sys.stderr, flush=True)
            return False
    return True


def _read_file(path: Path) -> bytes | None:
    """An entry's bytes, or None unless it is a regular file (not a link, nor a FIFO that would block)
    owned by the user or root and writable by no one else: checked on the open file, so it cannot be
    swapped between the check and the read."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return None
    with open(fd, "rb") as f:
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or not _ours(st) or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                return None
            return f.read()
        except OSError:
            return None


def _write_file(path: Path, data: bytes) -> None:
    """Write an entry atomically, mode 0600, in a private folder; nothing where others could write."""
    if _usable(path.parent):
        _private_folder(path.parent)
        atomic_write(path, data)  # mkstemp: 0600 whatever the umask


# ---------------------------------------------------------------------- cubin entries
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
    path = _entry_path(key)
    blob = _read_file(path) if _usable(path.parent) else None
    if blob is None:
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
        _write_file(_entry_path(key), _MAGIC + json.dumps(meta, sort_keys=True).encode() + b"\n" + cubin)
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
    """Context manager: the cross-process lock beside `key`'s entry (tlc.backend_cute.lock); none in a
    folder the cache does not use (`_usable`), where nothing is stored to wait for."""
    path = _entry_path(key)
    if not _usable(path.parent):
        return contextlib.nullcontext()
    with contextlib.suppress(OSError):  # a read-only cache: file_lock then compiles without the lock
        _private_folder(path.parent)
    return file_lock(path.with_suffix(".lock"), on_wait=on_wait)


# ---------------------------------------------------------------------- build index
# An index entry: the magic line, then one JSON document of this format and version.
_INDEX_MAGIC = b"TLCBUILD2\n"
INDEX_FORMAT = "tlc.build-index"
INDEX_VERSION = 2


def build_key(inputs: Mapping[str, Any]) -> str:
    """Key of a build's inputs, by name; the caller passes everything that decides the emitted source."""
    return _digest("build", inputs)


def _index_path(key: str) -> Path:
    return cache_dir() / key[:2] / f"{key}.build"


def lookup_build(key: str) -> dict | None:
    """The record `store_build` wrote for `key` (cubin_key, source, program, abi), or None: an entry
    that is torn, of another format or version, for another key, or that names anything but tlc's
    kernel-IR and ABI data classes is a miss (and is overwritten by the rebuild)."""
    if always_compile():
        return None
    path = _index_path(key)
    blob = _read_file(path) if _usable(path.parent) else None
    if blob is None or not blob.startswith(_INDEX_MAGIC):
        return None
    try:
        return _read_record(blob[len(_INDEX_MAGIC):], key)
    except (ValueError, RecursionError):  # the codec's and json's errors are ValueErrors
        return None


def _read_record(text: bytes, key: str) -> dict:
    from tlc.backend_cute import kir_codec
    from tlc.kir.ops import ProgramOp
    from tlc.lowering.abi import LaunchABI

    doc = json.loads(text)
    if not isinstance(doc, dict) or doc.get("format") != INDEX_FORMAT or type(doc.get("version")) is not int:
        raise ValueError("not a build index entry")
    if doc["version"] != INDEX_VERSION or doc.get("build_key") != key:
        raise ValueError("another version's or another key's entry")
    cubin_key, source = doc.get("cubin_key"), doc.get("source")
    if not isinstance(cubin_key, str) or not isinstance(source, str):
        raise ValueError("cubin_key or source is not a string")
    roots = kir_codec.decode(doc.get("ir"))
    program, abi = roots.get("program"), roots.get("abi")
    if type(program) is not ProgramOp or type(abi) is not LaunchABI:
        raise ValueError("not a kernel-IR program and its launch ABI")
    return {"build_key": key, "cubin_key": cubin_key, "source": source, "program": program, "abi": abi}


def store_build(key: str, record: Mapping[str, Any]) -> None:
    """Index a build: `record` holds cubin_key, source, program (the kernel-IR ProgramOp) and abi (its
    LaunchABI). A program the codec cannot write so that it reads back exactly is not indexed: the
    next build lowers it again and the cubin cache still serves the kernel."""
    from tlc.backend_cute import kir_codec

    try:
        ir = kir_codec.encode({"program": record["program"], "abi": record["abi"]})
        written = json.dumps(ir)
        if json.dumps(kir_codec.encode(kir_codec.decode(json.loads(written)))) != written:
            return
    except (ValueError, RecursionError):
        return
    doc = {"format": INDEX_FORMAT, "version": INDEX_VERSION, "build_key": key, "cubin_key": record["cubin_key"],
           "source": record["source"], "ir": ir}
    try:
        _write_file(_index_path(key), _INDEX_MAGIC + json.dumps(doc).encode())
    except OSError:
        pass


def clear_memory() -> None:
    _MEMORY.clear()
