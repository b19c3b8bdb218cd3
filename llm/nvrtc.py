"""Compile model-written CUDA/CuTe through tlc's NVRTC path (`tlc.backend_cute.nvrtc`).

The LLM translation backend and the vanilla baseline go through the same compiler, options
and headers as tlc's own emitter, so "it compiles" means the same thing for all three.
"""
from __future__ import annotations

import importlib
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Compiled:
    ok: bool
    cubin: bytes = b""
    log: str = ""  # NVRTC's diagnostics (what a repair round shows the model)
    unavailable: bool = False  # NVRTC or its headers are missing: not the model's fault


def compile_cuda(source: str, arch: str, name: str) -> Compiled:
    try:
        nvrtc = importlib.import_module("tlc.backend_cute.nvrtc")
        from tlc.diagnostics import TlcError
    except ImportError as exc:
        return Compiled(False, log=f"tlc's NVRTC wrapper is not available ({exc})", unavailable=True)
    try:
        result = nvrtc.compile_cubin(source, arch, name)
    except TlcError as exc:
        text = exc.render()
        # tlc words compile errors as below; anything else (headers, library, arch) is the toolchain
        compile_error = "failed to compile" in text or "NVRTC failed for" in text
        return Compiled(False, log=text, unavailable=not compile_error)
    except Exception as exc:  # noqa: BLE001 - the toolchain failing is reported, not raised
        if os.environ.get("TLC_DEBUG"):
            raise
        return Compiled(False, log=f"NVRTC failed to run ({type(exc).__name__}: {exc})", unavailable=True)
    return Compiled(True, result.cubin, result.log)
