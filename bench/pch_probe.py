"""NVRTC's precompiled headers (CUDA 12.8+) on tlc's default sm_90a d = 128 kernel: one compile that creates a PCH of
the CuTe headers, then compiles that use it, beside compiles without; prints seconds and the PCH's size. A probe for
whether PCH could cut a cold compile (docs/compile_time.md, "Precompiled headers"); no GPU needed.

    python3 bench/pch_probe.py [--heap-mb 1024]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--heap-mb", type=int, default=1024)
    heap = ap.parse_args().heap_mb << 20
    from cuda.bindings import nvrtc

    from tlc.attention.kernels import attention_spec
    from tlc.backend_cute.nvrtc import compile_options, nvrtc_version
    from tlc.lowering.emit_text import emit_text

    spec, defines = attention_spec("bf16", 128, 128, False, "sm_90a")
    source = emit_text(spec.read_bytes(), spec.name, "sm_90a",
                       {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in defines.items()}, "cute",
                       line_directives=False).encode()
    nvrtc.nvrtcSetPCHHeapSize(heap)
    pch = os.path.join(tempfile.mkdtemp(), "cute.pch")

    def compile_with(options: list[str]) -> tuple[float, object]:
        _, prog = nvrtc.nvrtcCreateProgram(source, b"k.cu", 0, [], [])
        opts = compile_options("sm_90a") + options
        start = time.perf_counter()
        (status,) = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
        seconds = time.perf_counter() - start
        created = nvrtc.nvrtcGetPCHCreateStatus(prog)[0]
        nvrtc.nvrtcDestroyProgram(prog)
        assert status == nvrtc.nvrtcResult.NVRTC_SUCCESS, status
        return seconds, created

    print(f"NVRTC {nvrtc_version()}, PCH heap {heap >> 20} MB")
    print(f"  without PCH        {compile_with([])[0]:6.2f} s")
    seconds, created = compile_with([f"--create-pch={pch}"])
    size = os.path.getsize(pch) >> 20 if os.path.exists(pch) else 0
    print(f"  creating the PCH   {seconds:6.2f} s  ({created}, {size} MB)")
    for _ in range(2):
        print(f"  using the PCH      {compile_with([f'--use-pch={pch}'])[0]:6.2f} s")
        print(f"  without PCH        {compile_with([])[0]:6.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
