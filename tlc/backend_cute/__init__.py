"""CuTe backend: kernel IR → CuTe C++ (emit) → NVRTC cubin (nvrtc, cache) → launch (launch).

Public entry points: `compile_kir(program, arch, line_directives=True) -> CompiledKernel` and
`tlc.backend_cute.launch.Kernel`.
"""
from __future__ import annotations

from tlc.backend_cute.compile import CompiledKernel, compile_kir

__all__ = ["CompiledKernel", "compile_kir"]
