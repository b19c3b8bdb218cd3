"""The launch ABI's head offsets are the kernel's expressions: what the GlobalTensorOp's offset multiplies the head
stride by (TL's integer `/` as floor_div, Params as numbers), so the launcher checks the heads the kernel reads
and never parses TL text (the launch path imports nothing of the frontend)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tlc.builder import lower_to_kernel_ir, module_kernel_name
from tlc.expr import BinOp, Var
from tlc.kir import ops as K
from tlc.lowering.abi import head_offset

ROOT = Path(__file__).resolve().parents[2]


def lowered(spec: str, kernel: str | None = None, **defines: str):
    text = (ROOT / "specs" / f"{spec}.tl").read_bytes()
    name = module_kernel_name(f"{spec}.tl", kernel) if kernel else spec
    return lower_to_kernel_ir(text, f"{spec}.tl", "sm_90", defines, name=name, kernel=kernel)[0]


def head_term(view: K.GlobalTensorOp) -> str:
    """The factor of the head stride in a global tensor's offset."""
    terms, stack = [], [view.offset]
    while stack:
        e = stack.pop()
        if isinstance(e, BinOp) and e.op == "+":
            stack += [e.lhs, e.rhs]
        else:
            terms.append(e)
    (head,) = [t.lhs for t in terms if isinstance(t, BinOp) and t.op == "*" and isinstance(t.rhs, Var)
               and t.rhs.name.endswith("_head_stride")]
    return str(head)


@pytest.mark.parametrize("spec, kernel", [("gqa_fwd", None), ("decode_fwd", "partial"), ("decode_fwd", "combine")])
def test_each_tensors_head_is_the_factor_of_its_head_stride_in_the_kernel(spec: str, kernel: str | None) -> None:
    state = lowered(spec, kernel, **({"Splits": "4"} if kernel else {}))
    views = {op.ptr.name[2:-4]: op for op in K.walk(state.kir) if isinstance(op, K.GlobalTensorOp)}
    for arg in state.abi.tensors:
        assert arg.head == head_term(views[arg.name]), arg.name


def test_the_launcher_evaluates_the_kernels_division_and_the_last_split() -> None:
    state = lowered("decode_fwd", "partial", Splits="4")
    args = {a.name: a for a in state.abi.tensors}
    assert args["K"].head == "floor_div(head_idx, group)"
    assert head_offset(args["K"].head, {"head_idx": 7, "group": 4}) == 1
    assert (args["O_part"].head, args["O_part"].head_last) == ("head_idx * 4 + split_idx", "head_idx * 4 + 3")
    assert args["O_part"].head_count(8, 4) == 32   # 8 query heads, each 4 splits


def test_the_launch_path_imports_nothing_of_the_frontend() -> None:
    for path in (ROOT / "tlc" / "backend_cute").glob("launch*.py"):
        tree = ast.parse(path.read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module} | {
            a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert not any(m.startswith("tlc.frontend") for m in imported), (path.name, imported)
