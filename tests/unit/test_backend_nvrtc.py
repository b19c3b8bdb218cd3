"""NVRTC wrapper, header discovery, disk cache, ABI metadata. The real CuTe compiles (one per shipped
spec, with the disk-cache round trip) are in tests/nvrtc/test_nvrtc_specs.py."""
from __future__ import annotations

import json

import pytest

from tlc.backend_cute import cache
from tlc.backend_cute.compile import kernel_metadata, params_abi
from tlc.backend_cute.nvrtc import compile_cubin, log_to_diagnostics, parse_ptxas_info
from tlc.diagnostics import TlcError
from tests.lowering.programs import attention_kir

TINY = '#line 3 "spec.tl"\nextern "C" __global__ void k(float* x) { x[threadIdx.x] = 1.f; }\n'


def test_log_lines_map_back_to_tl():
    log = 'mha.tl(12): error: identifier "tSrQ" is undefined\nkernel.cu(40): warning #177-D: unused\n' \
          '/inc/cute/tensor.hpp(9): error: something\n'
    diags = log_to_diagnostics(log)
    assert diags[0].loc.file == "mha.tl" and diags[0].loc.line == 12
    assert diags[1].loc is None and "tensor.hpp:9" in diags[1].notes[0].message
    assert len(diags) == 2


def test_ptxas_info_parsing():
    log = ("ptxas         .     32 bytes stack frame, 48 bytes spill stores, 44 bytes spill loads\n"
           "ptxas info    : Used 255 registers, used 1 barriers")
    assert parse_ptxas_info(log) == {"registers": 255, "spill_store_bytes": 48, "spill_load_bytes": 44,
                                     "stack_frame_bytes": 32}


def test_tiny_compile_and_error_mapping():
    result = compile_cubin(TINY, "sm_80")
    assert result.cubin[:4] == b"\x7fELF" and result.seconds > 0
    assert result.ptxas.get("registers", 0) > 0
    with pytest.raises(TlcError) as exc:
        compile_cubin(TINY.replace("1.f;", "1.f +;"), "sm_90")
    d = exc.value.diagnostics[0]
    assert d.loc is not None and d.loc.file == "spec.tl" and d.loc.line == 3


def test_unknown_arch_is_a_clear_error():
    with pytest.raises(TlcError, match="unsupported arch 'sm_75'"):
        compile_cubin(TINY, "sm_75")


def test_missing_headers_is_a_clear_error(monkeypatch):
    from tlc.backend_cute import headers
    headers.include_dirs.cache_clear()
    monkeypatch.setattr(headers, "_cutlass_include", lambda: None)
    try:
        with pytest.raises(TlcError, match="nvidia-cutlass"):
            headers.include_dirs()
    finally:
        headers.include_dirs.cache_clear()


def test_cache_round_trip_and_corrupt_entry(tmp_path, monkeypatch):
    monkeypatch.setenv("TLC_CACHE_DIR", str(tmp_path))
    cache.clear_memory()
    key = cache.cache_key("src", "sm_90", ["-O3"], "13.5")
    assert key != cache.cache_key("src", "sm_80", ["-O3"], "13.5")
    assert cache.lookup(key) is None
    cache.store(key, b"\x7fELFcubin", {"compile_seconds": 1.0})
    cache.clear_memory()
    cubin, meta = cache.lookup(key)
    assert cubin == b"\x7fELFcubin" and meta["compile_seconds"] == 1.0
    path = next(tmp_path.rglob("*.cubin"))
    path.write_bytes(path.read_bytes()[:-3])  # truncated write from a crash
    cache.clear_memory()
    assert cache.lookup(key) is None  # rebuilt by the caller
    monkeypatch.setenv("TLC_ALWAYS_COMPILE", "1")
    cache.store(key, b"x", {})
    assert cache.lookup(key) is None
    assert not list(tmp_path.rglob("*.tmp"))


def test_params_abi_matches_ctypes_layout():
    import ctypes

    from tlc.backend_cute.launch import params_struct
    program = attention_kir()
    params = program.body[0]
    abi = params_abi(params)
    struct = params_struct(params)
    assert abi["bytes"] == ctypes.sizeof(struct)
    for f in abi["fields"]:
        assert getattr(struct, f["name"]).offset == f["offset"]
    meta = kernel_metadata(program, "sm_90")
    assert meta["schema_version"] == 1
    assert meta["kernels"][0]["grid"] == ["ceil_div(p.seqlen_q, 128)", "p.heads", "p.batch"]
    json.dumps(meta)
