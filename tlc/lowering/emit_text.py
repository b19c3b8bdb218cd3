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
