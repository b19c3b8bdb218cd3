"""`warp-specialize` (sm_90a): goldens of the warp-specialised kernel IR and CuTe
(tests/lowering/warp_specialize.kirtest), the programs it leaves on the cp.async schedule and why,
and its Params. No NVRTC here (tests/nvrtc/test_sm90a_nvrtc.py compiles; tests/gpu/test_sm90a_specs_gpu.py runs).
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from tests.lowering.test_sm90a_lowering import SEPARATOR, _emit
from tests.unit.test_backend_emit import filecheck
from tlc.api import compile_graph
from tlc.diagnostics import TlcError
from tlc.kir import ops as K
from tlc.kir import ops_sm90 as H
from tlc.kir.expr import BinOp, Const, Var
from tlc.kir.transforms.warp_specialize import warp_specialize
from tlc.lowering.passes import run_lowering
from tlc.lowering.state import start_state
from tlc.passes.base import PassContext
from tlc.passes.pipeline import PassManager, parse_pipeline

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "specs" / "mha_fwd.tl"
GOLDEN = Path(__file__).with_name("warp_specialize.kirtest")
CASES = [c for c in SEPARATOR.split(GOLDEN.read_text()) if "CHECK" in c]


@pytest.mark.parametrize("case", CASES, ids=lambda c: re.search(r"^// TL: (.*)$", c, re.M).group(1))
def test_warp_specialize_goldens(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    monkeypatch.setenv("TLC_FOLD_PARTITIONS", "0")   # the RUN line's
    rc = filecheck(case, _emit(case), tmp_path)
    report = capsys.readouterr()
    assert rc == 0, f"{report.out}{report.err}"


def _before_pass(text: str | None = None) -> K.ProgramOp:
    """mha_fwd's kernel IR as warp-specialize receives it (lower-tile-ops, infer-layouts)."""
    graph, _ = compile_graph((text or SPEC.read_text()).encode(), str(SPEC))
    ctx = PassContext(arch="sm_90a")
    state = start_state(ctx, "sm_90a", name="mha_fwd")
    PassManager(parse_pipeline("lower-tile-ops{arch=sm_90a},infer-layouts")).run(graph, ctx)
    return state.kir


def _replace(program: K.ProgramOp, match, change) -> K.ProgramOp:
    """`program` with every op of its kernel's top level for which `match(op)` rebuilt by `change`."""
    kernel = program.kernels()[0]
    body = tuple(change(op) if match(op) else op for op in kernel.body)
    return dataclasses.replace(program, body=tuple(dataclasses.replace(kernel, body=body) if op is kernel else op
                                                    for op in program.body))


def _declined(program: K.ProgramOp) -> str:
    out, notes = warp_specialize(program, 2, 232448)
    assert out is program and len(notes) == 1, notes
    assert not any(isinstance(op, H.WarpSpecializeOp) for op in K.walk(out))
    return notes[0]


def test_specialises_mha_and_keeps_its_shared_budget() -> None:
    out, notes = warp_specialize(_before_pass(), 2, 232448)
    kernel = out.kernels()[0]
    assert kernel.threads == 384 and kernel.smem_bytes == 98304 + 8 * 9
    assert [op.name for op in K.walk(kernel) if isinstance(op, H.TmaDescriptorOp)] == ["tma_Q", "tma_K", "tma_V"]
    assert not any(isinstance(op, (K.AsyncCopyOp, K.CommitOp, K.WaitOp)) for op in K.walk(kernel))
    assert "warp group 2 loads sQ once, sK (2 stage(s)), sV (2 stage(s))" in notes[0]
    out, notes = warp_specialize(_before_pass(), 2, 232448, tma_store=True)
    assert notes[0].endswith("; thread 0 stores sO_out with TMA")
    assert [op.name for op in K.walk(out) if isinstance(op, H.TmaDescriptorOp)][-1] == "tma_O"


def test_a_tensor_offset_that_is_not_batch_and_head_strides_keeps_cp_async() -> None:
    program = _replace(_before_pass(), lambda op: isinstance(op, K.GlobalTensorOp) and op.name == "mK",
                       lambda op: dataclasses.replace(op, offset=Var("batch_idx")))
    assert "the offset of mK (`batch_idx`) is not batch and head strides" in _declined(program)


def test_a_tile_without_a_gmma_layout_keeps_cp_async() -> None:
    program = _replace(_before_pass(), lambda op: isinstance(op, H.GmmaSmemLayoutOp) and op.name == "sK_layout",
                       lambda op: dataclasses.replace(op, k_major=False, shape=(op.shape[1], op.shape[0])))
    assert "the copy into sK: its shared layout is not a 64×128 GMMA K-major 128-byte tile" in _declined(program)


def test_a_loop_with_a_stride_keeps_cp_async() -> None:
    program = _replace(_before_pass(), lambda op: isinstance(op, K.ForOp), lambda op: dataclasses.replace(op, step=2))
    assert "loop n steps by 2" in _declined(program)


def test_other_targets_and_the_param_keep_cp_async() -> None:
    graph, _ = compile_graph(SPEC.read_bytes(), str(SPEC))
    state, _ = run_lowering(graph, "sm_90", name="mha_fwd")
    assert not any(isinstance(op, H.WarpSpecializeOp) for op in K.walk(state.kir))
    graph, _ = compile_graph((SPEC.read_text() + "\nParam WarpSpecialize = false").encode(), str(SPEC))
    state, _ = run_lowering(graph, "sm_90a", name="mha_fwd")
    assert not any(isinstance(op, H.WarpSpecializeOp) for op in K.walk(state.kir))
    assert any(isinstance(op, K.AsyncCopyOp) for op in K.walk(state.kir))



def test_a_schedule_knob_binds_by_define_without_a_param() -> None:
    """`-D TmaStore=true` / `-D WarpSpecialize=false` act like the Param (spec files do not declare them)."""
    def ops(defines: dict) -> set:
        graph, _ = compile_graph(SPEC.read_bytes(), str(SPEC), defines=defines)
        state, _ = run_lowering(graph, "sm_90a", name="mha_fwd")
        return {type(op) for op in K.walk(state.kir)}

    assert H.TmaStoreOp not in ops({}) and H.TmaStoreOp in ops({"TmaStore": "true"})
    assert H.WarpSpecializeOp not in ops({"WarpSpecialize": "false"})
    graph, _ = compile_graph(SPEC.read_bytes(), str(SPEC), defines={"Stages": "7"})
    with pytest.raises(TlcError, match=re.escape("Param Stages = 7: the TMA ring takes 1 to 4 stages")):
        run_lowering(graph, "sm_90a", name="mha_fwd")


@pytest.mark.parametrize("param,message", [("WarpSpecialize = 3", "Param WarpSpecialize = 3: use true or false"),
                                           ("Stages = 5", "Param Stages = 5: the TMA ring takes 1 to 4 stages")])
def test_bad_params_are_one_line_errors(param: str, message: str) -> None:
    """Refused at the Param's own line."""
    text = SPEC.read_text() + f"\nParam {param}"
    graph, _ = compile_graph(text.encode(), str(SPEC))
    with pytest.raises(TlcError, match=re.escape(message)) as exc:
        run_lowering(graph, "sm_90a", name="mha_fwd")
    (diag,) = exc.value.diagnostics
    assert diag.loc is not None and diag.loc.line == len(text.splitlines())


@pytest.mark.parametrize("consumers,bn,regs", [(1, 64, 240), (2, 64, 240), (3, 96, 160), (4, 64, 112)])
def test_register_split_fits_the_register_file(consumers: int, bn: int, regs: int) -> None:
    """BN: whole passes of the cp.async copies lower-tile-ops emits first (48 rows on 384 threads). The split
    fits the pool the block starts with (threads x entry registers), not only the register file: 640
    threads start with 96 each, and consumers asking 120 each would wait in setmaxnreg.inc forever."""
    text = (SPEC.read_text().replace("Param BM = 128", f"Param BM = {64 * consumers}")
            .replace("Param BN = 64", f"Param BN = {bn}").replace("Param HeadDim = 128", "Param HeadDim = 64"))
    out, _ = warp_specialize(_before_pass(text), 1, 232448)
    roles = next(op for op in K.walk(out) if isinstance(op, H.WarpSpecializeOp))
    assert roles.consumer_regs == regs and roles.producer_regs == 24
    threads = 128 * (consumers + 1)
    assert 128 * (24 + consumers * regs) <= H.entry_registers(threads) * threads <= H.REGISTER_FILE


def test_a_register_split_past_the_entry_pool_is_refused() -> None:
    """The kernel-IR check refuses the split that hung a 640-thread kernel on an H200 (120 consumer registers)."""
    text = (SPEC.read_text().replace("Param BM = 128", "Param BM = 256").replace("Param BN = 64", "Param BN = 64")
            .replace("Param HeadDim = 128", "Param HeadDim = 64"))
    out, _ = warp_specialize(_before_pass(text), 1, 232448)
    kernel = out.kernels()[0]
    roles = next(op for op in K.walk(out) if isinstance(op, H.WarpSpecializeOp))
    hung = dataclasses.replace(roles, consumer_regs=120)
    body = tuple(hung if op is roles else op for op in kernel.body)
    with pytest.raises(Exception, match="pool of 61440"):
        dataclasses.replace(kernel, body=body).check()


def test_overlap_notes_and_param() -> None:
    """overlap-gemms says what it rotated, leaves a three-GEMM loop in order with the reason, and
    `Param Overlap` must be a bool."""
    spec = ROOT / "specs" / "chain3_fwd.tl"
    graph, _ = compile_graph(spec.read_bytes(), str(spec))
    state, _ = run_lowering(graph, "sm_90a", name="chain3_fwd")
    assert "overlap-gemms: loop n keeps its order: loop n runs 3 wgmma GEMMs, not two" in state.schedule
    graph, _ = compile_graph(SPEC.read_bytes(), str(SPEC))
    state, _ = run_lowering(graph, "sm_90a", name="mha_fwd")
    assert any(n.startswith("overlap-gemms: loop n: wgmma_S of trip n overlaps wgmma_O of trip n - 1")
               for n in state.schedule)
    graph, _ = compile_graph((SPEC.read_text() + "\nParam Overlap = 2").encode(), str(SPEC))
    with pytest.raises(TlcError, match=re.escape("Param Overlap = 2: use true or false")):
        run_lowering(graph, "sm_90a", name="mha_fwd")


def test_pingpong_needs_two_consumer_groups_and_a_bool() -> None:
    text = SPEC.read_text().replace("Param BM = 128", "Param BM = 64").replace("Param HeadDim = 128",
                                                                                "Param HeadDim = 64")
    graph, _ = compile_graph(text.encode(), str(SPEC))
    state, _ = run_lowering(graph, "sm_90a", name="mha_fwd")
    ids = [op.id for op in K.walk(state.kir) if isinstance(op, H.NamedBarrierOp)]
    assert ids == [0, 0], ids          # the epilogue's only: one consumer group takes no turns
    graph, _ = compile_graph((SPEC.read_text() + "\nParam PingPong = yes").encode(), str(SPEC))
    with pytest.raises(TlcError, match=re.escape("Param PingPong = 'yes': use true or false")):
        run_lowering(graph, "sm_90a", name="mha_fwd")


@pytest.mark.parametrize("defines", [{}, {"Causal": True}, {"Overlap": False}])
def test_warp_specialised_kernel_ir_round_trips_as_text(defines: dict) -> None:
    """print → parse → print is stable for the Hopper schedule's ops (roles, rings, carries, turn barriers)."""
    from tlc.kir.text import parse_kir, print_kir

    extra = {k: v for k, v in defines.items() if k == "Overlap"}
    text_spec = SPEC.read_text() + "".join(f"\nParam {k} = {str(v).lower()}" for k, v in extra.items())
    graph, _ = compile_graph(text_spec.encode(), str(SPEC),
                             defines={k: str(v).lower() for k, v in defines.items() if k not in extra})
    program = run_lowering(graph, "sm_90a", name="mha_fwd")[0].kir
    text = print_kir(program)
    again = parse_kir(text)
    assert print_kir(again) == text
    assert [type(op) for op in K.walk(again)] == [type(op) for op in K.walk(program)]


def test_overlap_keeps_a_loop_that_reads_o_after_its_gemms() -> None:
    """Rotated, O is short of the trip's own P·V at the trip's end: a loop that reads O there keeps its order."""
    from tlc.kir.transforms.attention.overlap_gemms import overlap_gemms

    graph, _ = compile_graph(SPEC.read_bytes(), str(SPEC))
    ctx = PassContext(arch="sm_90a")
    state = start_state(ctx, "sm_90a", name="mha_fwd")
    PassManager(parse_pipeline("lower-tile-ops{arch=sm_90a},infer-layouts,warp-specialize,insert-sync,"
                               "defer-reductions")).run(graph, ctx)
    kernel = state.kir.kernels()[0]
    roles = next(op for op in kernel.body if isinstance(op, H.WarpSpecializeOp))
    loop = next(op for op in roles.consumer if isinstance(op, K.ForOp))
    reads_o = K.MapOp(target="m", srcs=("rO",), fn=Var("x0"))
    changed = dataclasses.replace(loop, body=(*loop.body, reads_o))
    roles2 = dataclasses.replace(roles, consumer=tuple(changed if op is loop else op for op in roles.consumer))
    kernel2 = dataclasses.replace(kernel, body=tuple(roles2 if op is roles else op for op in kernel.body))
    out, notes = overlap_gemms(kernel2)
    assert out == kernel2
    assert notes == ["overlap-gemms: loop n keeps its order: loop n: rO is used outside the two GEMMs and the "
                     "rescale between them"]
    out, notes = overlap_gemms(kernel)
    assert out != kernel and notes[0].startswith("overlap-gemms: loop n: wgmma_S of trip n overlaps")


def test_a_ring_tile_read_after_its_loop_or_written_by_registers_keeps_cp_async() -> None:
    program = _before_pass()
    kernel = program.kernels()[0]
    late_read = K.CopyOp(copy="r2s_copy", src=Var("tOrO"), dst=Var("tOsO"), reads=("sK",))
    read_after = dataclasses.replace(program, body=tuple(
        dataclasses.replace(op, body=(*op.body, late_read)) if op is kernel else op for op in program.body))
    assert "sK is loaded in loop n and read after it" in _declined(read_after)
    reg_write = K.CopyOp(copy="r2s_copy", src=Var("tOrO"), dst=Var("tOsO"), writes=("sV",))
    written = dataclasses.replace(program, body=tuple(
        dataclasses.replace(op, body=(*op.body, reg_write)) if op is kernel else op for op in program.body))
    assert "registers also write a tile the copies load (sV)" in _declined(written)


def test_a_tensor_whose_rows_are_an_expression_keeps_cp_async() -> None:
    program = _replace(_before_pass(), lambda op: isinstance(op, K.GlobalTensorOp) and op.name == "mK",
                       lambda op: dataclasses.replace(op, rows=BinOp("-", Var("p.seqlen_k"), Const(1))))
    assert "mK has `p.seqlen_k - 1` rows, not a launch input or a constant" in _declined(program)


GQA = SPEC.parent / "gqa_fwd.tl"


def _lower_gqa(arch: str, **defines: str):
    graph, _ = compile_graph(GQA.read_bytes(), str(GQA), defines=defines)
    return run_lowering(graph, arch, name="gqa_fwd")[0]


def test_tile_rows_that_are_not_whole_cp_async_passes_build_only_with_tma() -> None:
    """80 K/V rows on 256 threads (32 rows a pass): TMA boxes take them on sm_90a; cp.async refuses them
    at the copy's line, on sm_90 and on sm_90a when warp-specialize is off."""
    state = _lower_gqa("sm_90a", HeadDim="256", BN="80", Warps="8")
    assert any(isinstance(op, H.TmaLoadOp) for op in K.walk(state.kir))
    assert not any(isinstance(op, K.AsyncCopyOp) for op in K.walk(state.kir))
    for arch, extra, tail in (("sm_90a", {"WarpSpecialize": "false"}, "(the copies stay cp.async: WarpSpecialize is false)"),
                              ("sm_90", {}, "make the tile rows a multiple of 32")):
        with pytest.raises(TlcError, match=re.escape("a 80-row tile cannot be copied by 256 threads")) as exc:
            _lower_gqa(arch, HeadDim="256", BN="80", Warps="8", **extra)
        (diag,) = exc.value.diagnostics
        k_copy = GQA.read_text().splitlines().index("  Copy K (BN, HeadDim) in coordinate [L = n] from global to shared")
        assert diag.message.endswith(tail) and diag.loc is not None and diag.loc.line == k_copy + 1


def test_the_carried_p_counts_at_its_converted_width() -> None:
    """overlap-gemms' P (`rP_keep`, bf16) is half its fp32 template's registers: d = 256 fits 128×96 in
    the consumers' 240 registers (rO 128 + P 24 + S 48 + statistics), not 128×128."""
    state = _lower_gqa("sm_90a", HeadDim="256", BN="96", Warps="8")
    regs = {a.name: a.bytes for a in state.resources.regs}
    assert regs.get("rP_keep") == 24 and "acc_S_like" not in regs and state.resources.regs_peak <= 240
    with pytest.raises(TlcError, match=re.escape("needs 244 registers per thread")) as exc:
        _lower_gqa("sm_90a", HeadDim="256", BN="128", Warps="8")
    assert "rP_keep 32 registers" in str(exc.value)
