"""NVRTC compiles of the hand-built Hopper tile GEMM (tests/nvrtc/sm90_programs.py) for sm_90a, no GPU:
the product's NVRTC wrapper builds a cubin with no spills and no ignored setmaxnreg, the C++ struct has
the layout the launcher packs, and the PTX holds the instructions the ops stand for. ~15 s per compile
on a 2-core machine.

The struct's layout is read from the PTX: `offsetof` from `<cuda/std/cstddef>` initialises a `__device__`
array that NVRTC writes out as bytes. A `static_assert` cannot hold it: CCCL's `offsetof` under NVRTC is
not a constant expression, and NVRTC 13.0 (the GPU machines') has no `__builtin_offsetof`."""
from __future__ import annotations

import ctypes
import re
import time

import pytest

from tests.nvrtc.sm90_programs import tile_gemm_sm90
from tlc.backend_cute.emit import emit_program
from tlc.backend_cute.launch import params_struct
from tlc.backend_cute.nvrtc import compile_cubin, compile_options

LAYOUT_ARRAY = "tlc_launch_struct_layout"


def _layout_array(program) -> str:
    """A `__device__` array of the C++ struct's size and field offsets, in the order `launch.py` packs them."""
    params = program.body[0]
    names = [n for n, _ in params.fields] + list(params.descriptors)
    values = [f"sizeof({params.name})"] + [f"offsetof({params.name}, {n})" for n in names]
    return ("#include <cuda/std/cstddef>\n"
            f"__device__ const unsigned long long {LAYOUT_ARRAY}[] = {{{', '.join(values)}}};\n")


def _ptx_array(ptx: str, name: str) -> list[int]:
    """The 64-bit values of a `__device__` array as PTX spells it: `.b8 name[N] = {bytes}` (trailing zeros may
    be left out)."""
    match = re.search(rf"\.global \.align \d+ \.b8 {name}\[(\d+)\] = \{{([\d, ]*)\}};", ptx)
    assert match, f"{name} not in the PTX"
    data = [int(b) for b in match.group(2).split(",") if b.strip()]
    data += [0] * (int(match.group(1)) - len(data))
    return [int.from_bytes(bytes(data[i:i + 8]), "little") for i in range(0, len(data), 8)]


@pytest.mark.slow
def test_tile_gemm_compiles_for_sm90a() -> None:
    program = tile_gemm_sm90()
    source = emit_program(program, source="sm90_programs.py")
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
        if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            err, size = nvrtc.nvrtcGetProgramLogSize(prog)
            log = b" " * size
            nvrtc.nvrtcGetProgramLog(prog, log)
            pytest.fail(log.rstrip(b"\x00 ").decode(errors="replace")[:4000])
        err, size = nvrtc.nvrtcGetPTXSize(prog)
        buf = b" " * size
        nvrtc.nvrtcGetPTX(prog, buf)
        return buf.rstrip(b"\x00 ").decode()
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


@pytest.fixture(scope="module")
def tile_gemm_ptx() -> str:
    """One PTX compile of the tile GEMM with its launch struct's layout array appended."""
    program = tile_gemm_sm90()
    return _ptx(emit_program(program, line_directives=False) + _layout_array(program), "sm_90a")


@pytest.mark.slow
def test_launch_struct_layout_matches_ctypes(tile_gemm_ptx: str) -> None:
    params = tile_gemm_sm90().body[0]
    struct = params_struct(params)
    names = [n for n, _ in params.fields] + list(params.descriptors)
    expected = [ctypes.sizeof(struct)] + [getattr(struct, n).offset for n in names]
    assert _ptx_array(tile_gemm_ptx, LAYOUT_ARRAY) == expected, names


@pytest.mark.slow
def test_tile_gemm_ptx_has_the_hopper_instructions(tile_gemm_ptx: str) -> None:
    ptx = tile_gemm_ptx
    # 64 / 16 k-blocks of one m64n128k16 wgmma per consumer warp group, one TMA per operand tile.
    assert ptx.count("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16") == 4
    assert ptx.count("cp.async.bulk.tensor.2d") == 2
    for instruction in ("wgmma.fence", "wgmma.commit_group", "wgmma.wait_group", "setmaxnreg.inc.sync.aligned.u32 232",
                        "setmaxnreg.dec.sync.aligned.u32 40", "mbarrier.try_wait.parity", "mbarrier.arrive.expect_tx",
                        "mbarrier.init", "fence.mbarrier_init"):
        assert instruction in ptx, instruction
