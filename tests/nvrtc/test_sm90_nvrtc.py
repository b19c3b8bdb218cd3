"""NVRTC compiles of the hand-built Hopper tile GEMM (tests/nvrtc/sm90_programs.py) for sm_90a, no GPU:
the product's NVRTC wrapper builds a cubin with no spills and no ignored setmaxnreg, the C++ struct has
the layout the launcher packs, and the PTX holds the instructions the ops stand for. ~15 s per compile
on a 2-core machine."""
from __future__ import annotations

import ctypes
import time

import pytest

from tests.nvrtc.sm90_programs import tile_gemm_sm90
from tlc.backend_cute.emit import emit_program
from tlc.backend_cute.launch import params_struct
from tlc.backend_cute.nvrtc import compile_cubin, compile_options


def _layout_asserts(program) -> str:
    """static_asserts that the C++ struct matches the ctypes struct `launch.py` fills."""
    params = program.body[0]
    struct = params_struct(params)
    names = [n for n, _ in params.fields] + list(params.descriptors)
    lines = [f"static_assert(sizeof({params.name}) == {ctypes.sizeof(struct)}, \"launch struct size\");"]
    lines += [f"static_assert(__builtin_offsetof({params.name}, {n}) == {getattr(struct, n).offset}, \"{n}\");"
              for n in names]
    return "\n".join(lines) + "\n"


@pytest.mark.slow
def test_tile_gemm_compiles_for_sm90a() -> None:
    program = tile_gemm_sm90()
    source = emit_program(program, source="sm90_programs.py") + _layout_asserts(program)
    start = time.perf_counter()
    result = compile_cubin(source, "sm_90a", "tile_gemm_sm90.cu")
    print(f"NVRTC sm_90a tile GEMM: {time.perf_counter() - start:.1f} s, {result.ptxas}")
    assert result.cubin[:4] == b"\x7fELF"
    assert result.ptxas["registers"] > 0 and result.ptxas.get("spill_store_bytes", 0) == 0
    assert result.ptxas.get("stack_frame_bytes", 0) == 0
    assert "C7508" not in result.log, result.log      # ptxas ignoring setmaxnreg says so with this warning


def _ptx(source: str, arch: str) -> str:
    from cuda.bindings import nvrtc

    options = [o.encode() for o in compile_options(arch)]
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), b"tile_gemm_sm90.cu", 0, [], [])
    try:
        (status,) = nvrtc.nvrtcCompileProgram(prog, len(options), options)
        assert status == nvrtc.nvrtcResult.NVRTC_SUCCESS
        err, size = nvrtc.nvrtcGetPTXSize(prog)
        buf = b" " * size
        nvrtc.nvrtcGetPTX(prog, buf)
        return buf.rstrip(b"\x00 ").decode()
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


@pytest.mark.slow
def test_tile_gemm_ptx_has_the_hopper_instructions() -> None:
    ptx = _ptx(emit_program(tile_gemm_sm90(), line_directives=False), "sm_90a")
    # 64 / 16 k-blocks of one m64n128k16 wgmma per consumer warp group, one TMA per operand tile.
    assert ptx.count("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16") == 4
    assert ptx.count("cp.async.bulk.tensor.2d") == 2
    for instruction in ("wgmma.fence", "wgmma.commit_group", "wgmma.wait_group", "setmaxnreg.inc.sync.aligned.u32 232",
                        "setmaxnreg.dec.sync.aligned.u32 40", "mbarrier.try_wait.parity", "mbarrier.arrive.expect_tx",
                        "mbarrier.init", "fence.mbarrier_init"):
        assert instruction in ptx, instruction
