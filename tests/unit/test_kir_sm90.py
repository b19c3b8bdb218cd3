"""The Hopper kernel-IR ops (tlc/kir/ops_sm90.py): verify(), text form, the emitted CuTe (FileCheck
goldens in sm90_emit.kirtest) and the launch side's struct layout and TMA encode arguments (no GPU)."""
from __future__ import annotations

import ctypes
import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from filecheck.finput import FInput
from filecheck.matcher import Matcher
from filecheck.options import Options
from filecheck.parser import Parser

from tests.nvrtc.sm90_programs import tile_gemm_sm90
from tlc.backend_cute.emit import emit_program
from tlc.backend_cute.launch import params_struct, tma_encode_args
from tlc.diagnostics import TlcError
from tlc.kir.expr import parse_expr as E
from tlc.kir.ops import OP_CLASSES, ProgramOp
from tlc.kir.ops_sm90 import (SM90_OP_CLASSES, GmmaSmemLayoutOp, MbarrierArriveExpectTxOp, MbarrierOp,
                              NamedBarrierOp, Sm90KernelOp, TmaDescriptorOp, TmaLoadOp, TmaParamsOp,
                              WarpSpecializeOp, WgmmaFragmentOp, WgmmaTiledMmaOp, WgmmaWaitOp, tma_descriptors)
from tlc.kir.text import parse_kir, print_kir

GOLDEN = Path(__file__).with_name("sm90_emit.kirtest")
SEPARATOR = re.compile(r"^// -----\s*$", re.M)
DESC = dict(name="tma_A", ptr=E("p.A_ptr"), dtype="bf16", box=(128, 64), swizzle=128)
MMA = dict(name="mma", dtype="bf16", kind="SS", tile=(64, 128, 64), warp_groups=(2, 1, 1), thread_slice="thr")


def test_ops_are_registered_for_text_and_emission() -> None:
    for cls in SM90_OP_CLASSES:
        assert OP_CLASSES[cls.__name__] is cls


@pytest.mark.parametrize("op, message", [
    (lambda: TmaDescriptorOp(**{**DESC, "ptr": E("A_ptr")}), "pointer field"),
    (lambda: TmaDescriptorOp(**{**DESC, "box": (128, 128)}), "exceeds the 128-byte swizzle span"),
    (lambda: TmaDescriptorOp(**{**DESC, "box": (512, 64)}), "at most 256"),
    (lambda: TmaDescriptorOp(**{**DESC, "box": (128, 4)}), "multiple of 16"),
    (lambda: TmaDescriptorOp(**{**DESC, "swizzle": 256}), "swizzle 256"),
    (lambda: GmmaSmemLayoutOp(name="l", dtype="bf16", swizzle=128, shape=(128, 32)), "not a multiple of"),
    (lambda: GmmaSmemLayoutOp(name="l", dtype="bf16", swizzle=128, shape=(96, 64), k_major=False), "not a multiple"),
    (lambda: MbarrierOp(name="b", count=2, offset_bytes=12), "8-byte aligned"),
    (lambda: MbarrierArriveExpectTxOp(bar="b", stage=E("0"), bytes=0), "bytes=0"),
    (lambda: TmaLoadOp(desc="d", bar="b", stage=E("0"), dst="s", coord=(E("0"),) * 2, dst_coord=(4, 0)), "multiple of 8"),
    (lambda: WgmmaTiledMmaOp(**{**MMA, "tile": (32, 128, 64)}), "multiple of 64"),
    (lambda: WgmmaTiledMmaOp(**{**MMA, "tile": (64, 512, 64)}), "up to 256"),
    (lambda: WgmmaTiledMmaOp(**{**MMA, "kind": "RS", "a_k_major": False}), "registers is K-major"),
    (lambda: WgmmaTiledMmaOp(**{**MMA, "dtype": "fp32"}), "bf16 or fp16"),
    (lambda: WgmmaFragmentOp(name="f", mma="mma", role="C", src=E("x")), "C fragments a shape"),
    (lambda: WgmmaWaitOp(pending=8), "0..7"),
    (lambda: WarpSpecializeOp(group="g", producer_regs=44, consumer_regs=232, producer=(), consumer=()), "multiple of 8"),
    (lambda: WarpSpecializeOp(group="g", producer_regs=240, consumer_regs=232, producer=(), consumer=()), "gives registers"),
    (lambda: NamedBarrierOp(id=8, threads=256), "0..7"),
    (lambda: NamedBarrierOp(id=1, threads=100), "whole warps"),
    (lambda: TmaParamsOp(name="p", fields=(("A_ptr", "ptr<bf16>"),), descriptors=("A_ptr",)), "name of a field"),
    (lambda: TmaParamsOp(name="p", fields=(), descriptors=("d", "d")), "twice"),
])
def test_verify_refuses(op, message: str) -> None:
    with pytest.raises(TlcError, match=re.escape(message)):
        op().verify()


def _kernel(program: ProgramOp) -> Sm90KernelOp:
    return program.kernels()[0]


def test_kernel_checks_the_register_budget_of_its_roles() -> None:
    program = tile_gemm_sm90(consumer_regs=256)     # 40·128 + 256·256 > 168·384, the pool 384 threads start with
    with pytest.raises(TlcError, match="a pool of 64512"):
        program.verify()
    with pytest.raises(TlcError, match="min_blocks=1"):
        replace(_kernel(tile_gemm_sm90()), min_blocks=2).verify()


def test_text_round_trip_of_the_gemm() -> None:
    text = print_kir(tile_gemm_sm90())
    assert print_kir(parse_kir(text)) == text
    assert "TmaParamsOp(name=gemm_params" in text and "descriptors=(tma_A, tma_B)" in text
    assert "WarpSpecializeOp(group=warp_group, producer_regs=40, consumer_regs=232, producer=[" in text


def test_descriptor_slots_and_declarations_agree() -> None:
    program = tile_gemm_sm90()
    table = tma_descriptors(program)["gemm_params"]
    assert list(table) == ["tma_A", "tma_B"] and table["tma_B"].box == (128, 64)
    params, kernel = program.body
    with pytest.raises(TlcError, match="declared by no TmaDescriptorOp"):
        tma_descriptors(replace(program, body=(replace(params, descriptors=("tma_A", "tma_B", "tma_C")), kernel)))
    with pytest.raises(TlcError, match="has no slot in gemm_params"):
        tma_descriptors(replace(program, body=(replace(params, descriptors=("tma_A",)), kernel)))


def test_params_struct_places_descriptors_as_cpp_does() -> None:
    struct = params_struct(tile_gemm_sm90().body[0])
    # Fields end at byte 36; each CUtensorMap starts on a 64-byte boundary; sizeof is a multiple of 64.
    assert (struct.K.offset, struct.tma_A.offset, struct.tma_B.offset, ctypes.sizeof(struct)) == (32, 64, 192, 320)


def test_tma_encode_arguments_from_a_tensor() -> None:
    desc = TmaDescriptorOp(**DESC)
    a = torch.empty(384, 448, dtype=torch.bfloat16)
    args = tma_encode_args(desc, a)
    assert args["dims"] == (448, 384) and args["strides"] == (896,) and args["box"] == (64, 128)
    assert args["dtype"] == "BFLOAT16" and args["swizzle"] == "128B" and args["rank"] == 2
    q = torch.empty(2, 8, 100, 64, dtype=torch.bfloat16).transpose(1, 2)      # (batch, rows, heads, d) view
    args4 = tma_encode_args(TmaDescriptorOp(**{**DESC, "box": (1, 64, 1, 64)}), q)
    assert args4["dims"] == (64, 8, 100, 2) and args4["strides"] == (128 * 100, 128, 2 * 8 * 100 * 64)


@pytest.mark.parametrize("tensor, message", [
    (lambda: torch.empty(128, 64, dtype=torch.bfloat16).t(), "contiguous"),
    (lambda: torch.empty(128, 12, dtype=torch.bfloat16), "not a multiple of 16"),
    (lambda: torch.empty(128, 64, dtype=torch.float32), "elements are 4 bytes"),
    (lambda: torch.empty(2, 128, 64, dtype=torch.bfloat16), "3 dimensions"),
])
def test_tma_encode_refuses(tensor, message: str) -> None:
    with pytest.raises(TlcError, match=message):
        tma_encode_args(TmaDescriptorOp(**DESC), tensor())


def _emit_case(case: str) -> str:
    build = re.search(r"^// BUILD: tile_gemm_sm90(.*)$", case, re.M)
    if build:
        program = tile_gemm_sm90(**{k: int(v) for k, v in (kv.split("=") for kv in build.group(1).split())})
    else:
        kir = "\n".join(m.group(1) for m in re.finditer(r"^// KIR: ?(.*)$", case, re.M))
        program = parse_kir(kir)
    return emit_program(program, line_directives=False)


@pytest.mark.parametrize("index", range(len(SEPARATOR.split(GOLDEN.read_text()))))
def test_emit_goldens(index: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    case = SEPARATOR.split(GOLDEN.read_text())[index]
    check = tmp_path / "case.check"
    check.write_text(case)
    opts = Options(match_filename=str(check), check_prefixes=["CHECK"])
    output = _emit_case(case)
    rc = Matcher(opts, FInput("<emitted>", FInput.canonicalize_line_ends(output)), Parser.from_opts(opts)).run()
    report = capsys.readouterr()
    assert rc == 0, f"{GOLDEN.name} case {index}:\n{report.out}{report.err}"


def test_emitter_refuses_a_load_into_a_non_buffer() -> None:
    text = print_kir(tile_gemm_sm90()).replace("dst=sB", "dst=tma_B")
    with pytest.raises(TlcError, match="needs `tma_B` to be a SharedBufferOp"):
        emit_program(parse_kir(text))


def test_emission_is_deterministic_and_marks_tl_lines() -> None:
    assert emit_program(tile_gemm_sm90()) == emit_program(tile_gemm_sm90())


def test_launcher_writes_each_descriptor_into_its_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    """The packing half of a launch, on the CPU: the encoder is replaced by a marker per slot."""
    from tlc.backend_cute import launch
    from tlc.backend_cute.compile import CompiledKernel
    from tlc.lowering.abi import LaunchABI

    program = tile_gemm_sm90()
    kernel = launch.Kernel(CompiledKernel(program, "sm_90a", "", b"", {}, 0.0), LaunchABI("g", (), (), "1", 1))
    monkeypatch.setattr(launch, "encode_tma", lambda desc, t: bytes([len(desc.name) + ord(desc.name[-1])]) * 128)
    a, b = torch.empty(128, 64, dtype=torch.bfloat16), torch.empty(256, 64, dtype=torch.bfloat16)
    values = {"A_ptr": a.data_ptr(), "B_ptr": b.data_ptr(), "C_ptr": 0, "M": 128, "N": 256, "K": 64}
    params = kernel._struct(**values)
    kernel._fill_descriptors(params, values, {"A_ptr": a, "B_ptr": b})
    raw = ctypes.string_at(ctypes.addressof(params), ctypes.sizeof(params))
    assert raw[64:192] == bytes([5 + ord("A")]) * 128 and raw[192:320] == bytes([5 + ord("B")]) * 128
    assert int.from_bytes(raw[32:36], "little") == 64                     # K, before the slots
    with pytest.raises(TlcError, match="needs the tensor of B_ptr"):
        kernel._fill_descriptors(params, values, {"A_ptr": a})
    with pytest.raises(TlcError, match="but its tensor is at"):
        kernel._fill_descriptors(params, dict(values, A_ptr=a.data_ptr() + 16), {"A_ptr": a, "B_ptr": b})
