"""`compile_kir`: kernel IR → CuTe source → cubin, through the dispatch dict and the disk cache."""
from __future__ import annotations

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
_PARAM_BYTES = {"ptr<bf16>": 8, "ptr<fp16>": 8, "ptr<f32>": 8, "i32": 4, "i64": 8, "f32": 4}


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


class _Progress:
    """Prints a line on stderr when a compile runs longer than a few seconds (NVRTC has no callback)."""

    def __init__(self, what: str, after: float = 3.0) -> None:
        self._what, self._after = what, after
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        start = time.perf_counter()
        while not self._done.wait(self._after):
            print(f"tlc: compiling {self._what} with NVRTC… {time.perf_counter() - start:.0f} s",
                  file=sys.stderr, flush=True)
            self._after = 10.0

    def __enter__(self) -> "_Progress":
        if sys.stderr.isatty():
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()


def compile_kir(program: ProgramOp, arch: str, *, line_directives: bool = True, source_name: str = "<kir>",
                cu_name: str | None = None) -> CompiledKernel:
    if not isinstance(program, ProgramOp):
        raise fail(f"compile_kir needs a kernel-IR ProgramOp, got {type(program).__name__}")
    cu_name = cu_name or f"{program.name}.cu"
    source = emit_program(program, source=source_name, line_directives=line_directives, cu_name=cu_name)
    options = compile_options(arch)
    nv = nvrtc_version()
    key = cache.cache_key(source, arch, options, nv)
    meta = kernel_metadata(program, arch)
    meta["versions"] = dict(versions(), nvrtc=nv)
    meta["cache_key"] = key
    hit = cache.lookup(key)
    if hit is not None:
        cubin, stored = hit
        return CompiledKernel(program, arch, source, cubin, stored, stored.get("compile_seconds", 0.0), True,
                              [k.name for k in program.kernels()])
    with _Progress(program.name):
        result = compile_cubin(source, arch, cu_name)
    meta["compile_seconds"] = round(result.seconds, 3)
    meta["ptxas"] = result.ptxas
    meta["nvrtc_options"] = [o for o in result.options if not o.startswith("-I")]
    cache.store(key, result.cubin, meta)
    cache.dump(program.name, {".cu": source, ".cubin": result.cubin, ".log": result.log})
    return CompiledKernel(program, arch, source, result.cubin, meta, result.seconds, False,
                          [k.name for k in program.kernels()])
