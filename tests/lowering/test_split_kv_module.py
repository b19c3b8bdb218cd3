"""specs/split_kv_fwd.tl built: three kernels lowered one by one for both targets, their kernel IR run in order on
the tile evaluator (sm_90; each kernel's fp32 workspaces handed to the next) equal to the interpreter of the whole
program at odd sizes, and the launcher of the program (tlc.backend_cute.launch_module) on the CPU: the kernels
launched in order, each workspace one kernel stores bound to the next kernel's pointer, the outputs returned."""
from __future__ import annotations

import ctypes
import math
import re
import types
from functools import lru_cache
from pathlib import Path

import pytest
import torch

from tlc.api import compile_module
from tlc.backend_cute import launch
from tlc.backend_cute.launch_module import ModuleKernel
from tlc.builder import lower_to_kernel_ir, module_kernel_name
from tlc.diagnostics import TlcError
from tlc.ir.module import run_module
from tlc.kir import ops as K
from tlc.kir import ops_sm90 as H
from tlc.kir.tile_eval import evaluate_program

SPEC = Path(__file__).resolve().parents[2] / "specs" / "split_kv_fwd.tl"
SMALL = {"HeadDim": "32", "BM": "64", "BN": "32"}
NAMES = ("partial", "combine")


@lru_cache(maxsize=None)
def lowered(arch: str):
    return [(k, *lower_to_kernel_ir(SPEC.read_bytes(), "skv.tl", arch, SMALL, name=module_kernel_name("skv.tl", k),
                                    kernel=k)[:1]) for k in NAMES]


@pytest.mark.parametrize("sq, sk", [(1, 1), (17, 33), (65, 100), (70, 31)])
def test_the_kernels_in_order_equal_the_interpreter(sq: int, sk: int, arch: str = "sm_90") -> None:
    """sm_90 (the tile evaluator has no wgmma; sm_90a's kernels run on the GPU, tests/gpu)."""
    module, _ = compile_module(SPEC.read_text(), "skv.tl", defines=SMALL, run_passes=False)
    g = torch.Generator().manual_seed(sq * 100 + sk)
    env = {n: torch.randn(2, 4 if n == "Q" else 2, sq if n == "Q" else sk, 32, generator=g).to(torch.bfloat16).double()
           for n in "QKV"}
    scalars = {"seqlen_q": sq, "seqlen_k": sk, "scale": 1 / math.sqrt(32)}
    given = dict(env)
    for name, role in module.roles().items():
        if role != "input":
            heads = 16 if name.endswith("_part") else 4   # the workspaces: a head per (query head, split)
            given[name] = torch.full((2, heads, sq, 32) if name.startswith("O") else (2, heads, sq), float("nan"),
                                     dtype=torch.float64)
    want = run_module(module, given, scalars)
    for _, state in lowered(arch):
        ins = {a.name: env[a.name] for a in state.abi.tensors if not a.output}
        env.update(evaluate_program(state.kir, state.abi, ins, {k: v for k, v in scalars.items()
                                                                  if k in dict(state.abi.inputs)}))
    for name, tol in (("O", 2e-2), ("LSE", 1e-4)):
        assert not torch.isnan(env[name]).any()
        err = (env[name] - want[name]).abs().max().item()
        assert err <= tol * max(1.0, want[name].abs().max().item()), f"{arch} {sq}x{sk} {name}: {err:.3e}"


def test_sm90a_runs_the_partial_kernel_on_wgmma_and_the_combine_on_the_sm80_rules() -> None:
    kinds = [type(state.kir.kernels()[0]) for _, state in lowered("sm_90a")]
    assert kinds[0] is H.Sm90KernelOp and kinds[1] is not H.Sm90KernelOp


@pytest.mark.parametrize("arch", ["sm_90", "sm_90a"])
def test_the_split_axis_is_a_grid_axis_and_the_combine_views_each_split_in_its_loop(arch: str) -> None:
    (_, partial), (_, combine) = lowered(arch)
    kernel = partial.kir.kernels()[0]
    assert str(kernel.grid[2]) == "p.batch * 4"
    lets = {op.name: str(op.value) for op in kernel.body if isinstance(op, K.LetOp)}
    assert lets["batch_idx"] == "blockIdx.z / 4" and lets["split_idx"] == "blockIdx.z % 4"
    loop = next(op for op in K.walk(combine.kir) if isinstance(op, K.ForOp))
    views = [op for op in K.walk(loop) if isinstance(op, K.GlobalTensorOp)]
    assert len(views) == 2 and all("split_idx" in str(v.offset) for v in views)


class _Driver:
    """cuLaunchKernel's stand-in that records (kernel name, the struct's bytes) of each launch."""
    CUresult = types.SimpleNamespace(CUDA_SUCCESS=0)

    def __init__(self, sizes: dict[str, int]) -> None:
        self.sizes, self.launches = sizes, []

    def CUstream(self, stream):  # noqa: N802 - the driver's name
        return stream

    def cuLaunchKernel(self, function, gx, gy, gz, bx, by, bz, smem, stream, args, extra):  # noqa: N802
        struct = ctypes.c_void_p.from_address(args).value
        self.launches.append((function, ctypes.string_at(struct, self.sizes[function])))
        return (0,)


def stand_in_program(monkeypatch) -> tuple[ModuleKernel, list, _Driver]:
    """The sm_90a program's kernels on stand-ins (no GPU), each launch recorded by a `_Driver`."""
    from bench.launch_stand_ins import no_gpu, stand_in_kernel

    no_gpu(monkeypatch.setattr)
    kernels = []
    for name, state in lowered("sm_90a"):
        k = stand_in_kernel(state.kir, state.abi)
        k._loaded[0] = types.SimpleNamespace(resident_ctas=132, function=name)
        kernels.append((name, k))
    program = ModuleKernel(kernels, compile_module(SPEC.read_text(), "skv.tl", defines=SMALL)[0].roles())
    driver = _Driver({n: ctypes.sizeof(k._struct) for n, k in kernels})
    monkeypatch.setattr(launch, "_driver", lambda: driver)
    return program, kernels, driver


def test_the_program_launches_its_kernels_in_order_and_hands_on_the_workspaces(monkeypatch) -> None:
    from bench.launch_stand_ins import qkv

    program, kernels, driver = stand_in_program(monkeypatch)
    q, k, v = qkv(2, 4, 2, 40, 50, False, d=32)
    o, lse = program(q, k, v, scale=0.2)
    assert (o.shape, o.dtype, lse.shape, lse.dtype) == ((2, 4, 40, 32), torch.bfloat16, (2, 4, 40), torch.float32)
    assert [name for name, _ in driver.launches] == list(NAMES)
    structs = {name: dict(kernels)[name]._struct.from_buffer_copy(raw) for name, raw in driver.launches}
    assert structs["partial"].O_part_ptr == structs["combine"].O_part_ptr != 0
    assert structs["partial"].LSE_part_ptr == structs["combine"].LSE_part_ptr != 0
    assert structs["partial"].O_part_head_stride == 40 * 32 and structs["combine"].O_part_batch_stride == 16 * 40 * 32
    assert structs["combine"].O_ptr == o.data_ptr() and structs["combine"].LSE_ptr == lse.data_ptr()
    assert structs["partial"].scale == pytest.approx(0.2)
    with pytest.raises(TlcError, match="this program has no Input 'scael'"):
        program(q, k, v, scael=0.2)
    with pytest.raises(TlcError, match=r"this program takes 3 tensor\(s\) \(Q, K, V\), got 2"):
        program(q, k)


def test_a_repeated_geometry_launches_the_kept_steps_with_the_new_tensors(monkeypatch) -> None:
    """The second call of a geometry skips the checks (no kernel's __call__ runs) and launches the same structs but
    for the data pointers: its own tensors and fresh workspaces; another scale, or another geometry, plans anew."""
    from bench.launch_stand_ins import qkv

    program, kernels, driver = stand_in_program(monkeypatch)
    q, k, v = qkv(2, 4, 2, 40, 50, False, d=32)
    first = program(q, k, v, scale=0.2)
    checked = [(name, dict(kernels)[name]._struct.from_buffer_copy(raw)) for name, raw in driver.launches]
    for _, kern in kernels:   # a kept step must not go through the checked call
        monkeypatch.setattr(kern, "__call__", None)
    q2, k2, v2 = qkv(2, 4, 2, 40, 50, False, d=32)
    o, lse = program(q2, k2, v2, scale=0.2)
    kept = [(name, dict(kernels)[name]._struct.from_buffer_copy(raw)) for name, raw in driver.launches[2:]]
    assert [n for n, _ in kept] == list(NAMES) and (o.shape, lse.shape) == (first[0].shape, first[1].shape)
    for (name, a), (_, b) in zip(checked, kept):
        for field, _ in a._fields_:
            if field.endswith("_ptr") or not isinstance(getattr(a, field), (int, float)):
                continue   # data pointers, and what encodes them (TMA descriptors), are the new call's
            assert getattr(a, field) == getattr(b, field), (name, field)
    assert kept[0][1].Q_ptr == q2.data_ptr() and kept[1][1].O_ptr == o.data_ptr() != first[0].data_ptr()
    assert kept[0][1].O_part_ptr == kept[1][1].O_part_ptr != 0   # the workspace handed on
    program(q2, k2, v2, scale=0.3)   # another Input value: a new geometry, planned (scale 0.3 in the struct)
    assert dict(kernels)["partial"]._struct.from_buffer_copy(driver.launches[-2][1]).scale == pytest.approx(0.3)


def test_transforms_that_renumber_the_grid_decline_a_kernel_with_axes_of_its_own() -> None:
    """persistent and prefetch-next decode a tile's (x, y, z) and read z as the batch: on the partial kernel, whose
    z is batch · Splits, they decline (its split_idx would be lost), and the kernel stays one tile per CTA."""
    state, _ = lower_to_kernel_ir(SPEC.read_bytes(), "skv.tl", "sm_90a", dict(SMALL, Persistent="true",
                                                                               PrefetchNext="true"),
                                  name="skv_partial", kernel="partial")
    kernel = state.kir.kernels()[0]
    assert kernel.own_grid_axes() and str(kernel.grid[2]) == "p.batch * 4"
    assert not any(isinstance(op, (H.TileSlotOp, H.AtomicAddOp)) for op in K.walk(kernel))
    notes = " ".join(state.schedule)
    assert "grid axes of its own" in notes, notes


AXIS = """Param dtype = bf16
Param HeadDim = 32
Param BM = 64
Param S = 3
Input seqlen_q : int
Allocate X in global (seqlen_q, HeadDim) as fp32 with offset head_idx
Allocate Y in global (seqlen_q, HeadDim) as fp32 with offset {offset}
Kernel k over [a = {extent}]
Copy X (BM, HeadDim) in coordinate [L = block_idx] from global to register
Compute Exp X and get Y
Copy Y (BM, HeadDim) in coordinate [L = block_idx] from register to global
"""


@pytest.mark.parametrize("offset, extent, words", [
    ("head_idx * S - 1 + a", "S - 1", "is stored by every instance of the kernel's grid axes"),  # head −1
    ("head_idx * S + 1 + a", "S + 1", "is stored by every instance of the kernel's grid axes"),  # two write head 4
    ("head_idx", "S", "is stored by every instance of the kernel's grid axes"),                  # every a, one head
    ("head_idx * S + S - 1 - a", "S", "is stored by every instance of the kernel's grid axes"),   # not the form
    ("head_idx * 2 + a", "S", "is stored by every instance of the kernel's grid axes"),           # N is not a's extent
])
def test_an_offset_reading_a_grid_axis_takes_one_form(offset: str, extent: str, words: str) -> None:
    """Found by review: the stored offset was matched as text (`head_idx * S - 1 + a` passed: head −1 written, and
    with `S + 1` two instances wrote one head), a store at `head_idx` in a kernel with an axis raced, and a tensor
    was sized by the head the last axis value reaches even where that was not the largest."""
    text = AXIS.format(offset=offset, extent=extent)
    with pytest.raises(TlcError, match=re.escape(words) if "`" in words else words):
        lower_to_kernel_ir(text.encode(), "k.tl", "sm_90", {}, name="k_k", kernel="k")


def test_loops_over_a_name_an_offset_reads_must_all_span_it() -> None:
    """Found by review: of two loops over `s` the last was taken (0:2), so a tensor read up to head 4·h + 3 was sized
    for 4·h + 1."""
    text = """Param dtype = bf16
Param HeadDim = 32
Param BM = 64
Input seqlen_q : int
Allocate X in global (seqlen_q, HeadDim) as fp32 with offset head_idx * 4 + s
Allocate Y in global (seqlen_q, HeadDim) as fp32 with offset head_idx
Allocate Y in register (BM, HeadDim)
for s = 0:4
  Copy X (BM, HeadDim) in coordinate [L = block_idx] from global to register
  Compute Add Y, X and get new Y
end
for s = 0:2
  Compute Exp Y and get new Y
end
Copy Y (BM, HeadDim) in coordinate [L = block_idx] from register to global
"""
    with pytest.raises(TlcError, match=r"every loop over 's' must run 0:4 \(one runs 0:2\)"):
        lower_to_kernel_ir(text.encode(), "k.tl", "sm_90", {}, name="k")


def test_the_interpreter_and_the_launch_take_the_same_query_heads() -> None:
    """Found by review: with no tensor at head_idx, the interpreter ran as many query heads as the largest plain
    tensor has (1), the launch and the tile evaluator heads / N of the tensor at `head_idx * N + s` (3)."""
    from tlc.api import compile_graph
    from tlc.ir.interpreter import run_program
    from tlc.lowering.passes import run_lowering

    text = """Param dtype = bf16
Param HeadDim = 32
Param BM = 64
Param S = 2
Input seqlen_q : int
Allocate X in global (seqlen_q, HeadDim) as fp32 with offset head_idx * S + s
Allocate Y in global (seqlen_q, HeadDim) as fp32 with offset 0
Allocate Y in register (BM, HeadDim)
for s = 0:S
  Copy X (BM, HeadDim) in coordinate [L = block_idx] from global to register
  Compute Add Y, X and get new Y
end
Copy Y (BM, HeadDim) in coordinate [L = block_idx] from register to global and add
"""
    graph, _ = compile_graph(text, "h.tl")
    state, _ = run_lowering(graph, "sm_90", name="h")
    x = torch.randn(1, 6, 40, 32).float().double()
    want = run_program(graph, {"X": x, "Y": torch.zeros(1, 1, 40, 32, dtype=torch.float64)}, {"seqlen_q": 40})["Y"]
    got = evaluate_program(state.kir, state.abi, {"X": x}, {"seqlen_q": 40})["Y"]
    assert torch.allclose(want, x.sum(1, keepdim=True)) and (got - want).abs().max().item() < 1e-5


@pytest.mark.parametrize("axes, words", [("[p = 3]", "grid axis 'p' is already a name"),
                                         ("[a = 2, b = a + 1]", "the extent of grid axis 'b' reads 'a'")])
def test_what_a_grid_axis_cannot_be_is_refused(axes: str, words: str) -> None:
    text = AXIS.format(offset="head_idx * 3 + a", extent="3").replace("over [a = 3]", f"over {axes}")
    with pytest.raises(TlcError, match=re.escape(words)):
        lower_to_kernel_ir(text.encode(), "k.tl", "sm_90", {}, name="k_k", kernel="k")


def test_an_axis_may_extend_over_an_input() -> None:
    text = AXIS.format(offset="head_idx * n + a", extent="n").replace("Input seqlen_q : int", "Input seqlen_q, n : int")
    state, _ = lower_to_kernel_ir(text.encode(), "k.tl", "sm_90", {}, name="k_k", kernel="k")
    assert str(state.kir.kernels()[0].grid[2]) == "p.batch * p.n"


def test_each_kernels_program_states_the_launch_the_launcher_binds_from(monkeypatch) -> None:
    """The kernel IR of each kernel holds the program's LaunchOp (kernels in order, each tensor's role): printed,
    parsed back, a comment in the C++; `ModuleKernel.of_launch` takes its roles from it and refuses kernels given
    in another order."""
    from tlc.backend_cute.emit import emit_program
    from tlc.kir import parse_kir, print_kir

    program, kernels, _ = stand_in_program(monkeypatch)
    launches = [next(op for op in k.compiled.program.body if isinstance(op, K.LaunchOp)) for _, k in kernels]
    roles = compile_module(SPEC.read_text(), "skv.tl", defines=SMALL)[0].roles()
    assert launches[0] == launches[1] and launches[0].kernels == NAMES and launches[0].roles() == roles
    text = print_kir(kernels[0][1].compiled.program)
    assert print_kir(parse_kir(text)) == text
    assert "// launch: kernels partial → combine; tensors Q input, K input, V input, O_part workspace" in \
        emit_program(kernels[1][1].compiled.program)
    assert ModuleKernel.of_launch(kernels).roles == roles
    with pytest.raises(TlcError, match="do not state one launch of them in this order"):
        ModuleKernel.of_launch(kernels[::-1])
