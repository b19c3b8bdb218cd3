"""`compile_kir`: kernel IR → CuTe source → cubin, through the dispatch dict and the disk cache.

A miss takes the entry's cross-process lock, looks again (another process may have just built it),
and only then runs NVRTC; a compile past a second says so on stderr (`TLC_QUIET=1` silences it).
"""
from __future__ import annotations

import contextlib
import contextvars
import os
import sys
import threading
import time
from dataclasses import dataclass, field

from tlc.backend_cute import cache
from tlc.backend_cute.emit import emit_program
from tlc.backend_cute.headers import versions
from tlc.backend_cute.nvrtc import compile_cubin, compile_options, nvrtc_version
from tlc.diagnostics import fail
from tlc.kir.ops import ParamsOp, ProgramOp

SCHEMA_VERSION = 1
_PARAM_BYTES = {"ptr<bf16>": 8, "ptr<fp16>": 8, "ptr<f32>": 8, "ptr<i32>": 8, "i32": 4, "i64": 8, "f32": 4}


@dataclass
class CompiledKernel:
    """Result of `compile_kir`: everything `tlc build` writes and the launcher needs."""

    program: ProgramOp
    arch: str
    source: str
    cubin: bytes
    metadata: dict
    compile_seconds: float
    cached: bool = False
    kernels: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)  # seconds per phase of this call (bench/compile_time.py)


def params_abi(params: ParamsOp) -> dict:
    """C layout of the parameter struct (natural alignment), recorded in the `.json`."""
    offset, out = 0, []
    for name, ctype in params.fields:
        size = _PARAM_BYTES[ctype]
        offset = (offset + size - 1) // size * size
        out.append({"name": name, "type": ctype, "offset": offset, "bytes": size})
        offset += size
    return {"struct": params.name, "fields": out, "bytes": (offset + 7) // 8 * 8, "passed": "by value"}


def kernel_metadata(program: ProgramOp, arch: str) -> dict:
    structs = {op.name: op for op in program.body if isinstance(op, ParamsOp)}
    kernels = []
    for k in program.kernels():
        if k.params not in structs:
            raise fail(f"kernel {k.name} uses undefined params struct {k.params}", k.loc)
        kernels.append({"name": k.name, "params": k.params, "threads": k.threads, "min_blocks": k.min_blocks,
                        "grid": [str(g) for g in k.grid], "smem_bytes": k.smem_bytes})
    return {"schema": "tlc.kernel", "schema_version": SCHEMA_VERSION, "program": program.name, "arch": arch,
            "abi": {name: params_abi(p) for name, p in structs.items()}, "kernels": kernels}


_LABEL: contextvars.ContextVar[str | None] = contextvars.ContextVar("tlc_compile_label", default=None)


@contextlib.contextmanager
def progress_label(label: str):
    """Name the kernel in progress lines (e.g. the spec and its -D bindings) for compiles inside."""
    token = _LABEL.set(label)
    try:
        yield
    finally:
        _LABEL.reset(token)


PROGRESS_AFTER_S = 1.0  # compiles shorter than this print nothing


def quiet() -> bool:
    return os.environ.get("TLC_QUIET", "") not in ("", "0")


class _Progress:
    """A line on stderr once a compile has run `after` seconds, and one with its time when it ends;
    nothing for a quick compile or with TLC_QUIET=1 (NVRTC has no progress callback: a timer thread)."""

    def __init__(self, what: str, after: float | None = None) -> None:
        self._what, self._after = what, PROGRESS_AFTER_S if after is None else after
        self._done = threading.Event()
        self._announced = False
        self._start = time.perf_counter()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _say(self, text: str) -> None:
        print(f"tlc: {text}", file=sys.stderr, flush=True)

    def _run(self) -> None:
        if not self._done.wait(self._after):
            self._announced = True
            self._say(f"compiling {self._what} (first use of this shape; cached afterwards)...")

    def waiting(self) -> None:
        """The lock's on_wait: another process is compiling this very kernel."""
        if not quiet():
            self._say(f"waiting for another process compiling {self._what}...")

    def __enter__(self) -> "_Progress":
        self._start = time.perf_counter()
        if not quiet():
            self._thread.start()
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()
        if self._announced:
            how = "compiled" if exc_type is None else "failed compiling"
            self._say(f"{how} {self._what} in {time.perf_counter() - self._start:.1f} s")


def _from_cache(program: ProgramOp, arch: str, source: str, hit: tuple[bytes, dict],
                timings: dict[str, float]) -> CompiledKernel:
    cubin, stored = hit
    return CompiledKernel(program, arch, source, cubin, stored, stored.get("compile_seconds", 0.0), True,
                          [k.name for k in program.kernels()], timings)


def compile_kir(program: ProgramOp, arch: str, *, line_directives: bool = True, source_name: str = "<kir>",
                cu_name: str | None = None) -> CompiledKernel:
    if not isinstance(program, ProgramOp):
        raise fail(f"compile_kir needs a kernel-IR ProgramOp, got {type(program).__name__}")
    cu_name = cu_name or f"{program.name}.cu"
    start = time.perf_counter()
    source = emit_program(program, source=source_name, line_directives=line_directives, cu_name=cu_name)
    timings = {"emit": time.perf_counter() - start}
    options = compile_options(arch)
    nv = nvrtc_version()
    key = cache.cache_key(source, arch, options, nv)
    hit = cache.lookup(key)
    if hit is not None:
        return _from_cache(program, arch, source, hit, timings)
    meta = kernel_metadata(program, arch)
    meta["versions"] = dict(versions(), nvrtc=nv)
    meta["cache_key"] = key
    progress = _Progress(f"{_LABEL.get() or program.name} for {arch}")
    waited = time.perf_counter()
    with cache.entry_lock(key, on_wait=progress.waiting):
        timings["lock_wait"] = time.perf_counter() - waited
        hit = None if cache.always_compile() else cache.lookup(key)  # built while we waited?
        if hit is not None:
            return _from_cache(program, arch, source, hit, timings)
        with progress:
            result = compile_cubin(source, arch, cu_name)
        meta["compile_seconds"] = round(result.seconds, 3)
        meta["ptxas"] = result.ptxas
        meta["nvrtc_phases_ms"] = result.phases_ms
        meta["ptx_bytes"] = result.ptx_bytes
        meta["nvrtc_options"] = [o for o in result.options if not o.startswith("-I")]
        cache.store(key, result.cubin, meta)
    timings["nvrtc"] = result.seconds
    cache.dump(program.name, {".cu": source, ".cubin": result.cubin, ".log": result.log})
    return CompiledKernel(program, arch, source, result.cubin, meta, result.seconds, False,
                          [k.name for k in program.kernels()], timings)
