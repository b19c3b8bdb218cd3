"""`tlc show FILE --emit kir|cute`: the kernel IR or the CuTe C++ of a TL file, without NVRTC."""
from __future__ import annotations

from typing import Mapping

from tlc.names import kernel_name


def emit_text(data: bytes, path: str, arch: str, defines: Mapping[str, str], what: str, *,
              line_directives: bool = True, kernel: str | None = None) -> str:
    """TL passes → lowering passes → kernel-IR text (`kir`) or CuTe source (`cute`), through the lowering
    `tlc build` runs (tlc.builder.lower_to_kernel_ir), so both refuse the same programs. `kernel`: which kernel
    of a program of several."""
    from tlc.backend_cute.emit import emit_program
    from tlc.builder import lower_to_kernel_ir, module_kernel_name
    from tlc.kir.text import print_kir

    name = module_kernel_name(path, kernel)
    state, _ = lower_to_kernel_ir(data, path, arch, defines, name=name, kernel=kernel)
    if what == "kir":
        return print_kir(state.kir)
    return emit_program(state.kir, source=path, line_directives=line_directives, cu_name=f"{name}.cu")


def kernel_ir(path, arch: str = "sm_90", defines: Mapping[str, object] | None = None):
    """The lowered `ProgramOp` of a `.tl` file (TL passes, then every lowering pass)."""
    from pathlib import Path

    from tlc.builder import lower_to_kernel_ir
    from tlc.runtime import normal_defines

    state, _ = lower_to_kernel_ir(Path(path).read_bytes(), str(path), arch, normal_defines(defines),
                                  name=kernel_name(path))
    return state.kir
