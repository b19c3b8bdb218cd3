"""`tlc show FILE --emit kir|cute`: the kernel IR or the CuTe C++ of a TL file, without NVRTC."""
from __future__ import annotations

from typing import Mapping

from tlc.names import kernel_name


def emit_text(data: bytes, path: str, arch: str, defines: Mapping[str, str], what: str, *,
              line_directives: bool = True) -> str:
    """TL passes → lowering passes → kernel-IR text (`kir`) or CuTe source (`cute`)."""
    from tlc.api import compile_graph
    from tlc.backend_cute.emit import emit_program
    from tlc.kir.text import print_kir
    from tlc.lowering.passes import run_lowering

    graph, _ = compile_graph(data, path, defines=defines)
    name = kernel_name(path)
    state, _ = run_lowering(graph, arch, name=name)
    if what == "kir":
        return print_kir(state.kir)
    return emit_program(state.kir, source=path, line_directives=line_directives, cu_name=f"{name}.cu")


def kernel_ir(path, arch: str = "sm_90", defines: Mapping[str, object] | None = None):
    """The lowered `ProgramOp` of a `.tl` file (TL passes, then every lowering pass)."""
    from pathlib import Path

    from tlc.api import compile_graph
    from tlc.lowering.passes import run_lowering

    defs = {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in (defines or {}).items()}
    graph, _ = compile_graph(Path(path).read_bytes(), str(path), defines=defs)
    state, _ = run_lowering(graph, arch, name=kernel_name(path))
    return state.kir
