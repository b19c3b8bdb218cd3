"""verify: the first pass — structure only (names, memory spaces, arity, SSA), no repairs.

Later passes may then assume every op is well formed; what the paper's rules require
(Allocates, Reshapes, `.T`) is checked after the repairs, by verify-final. It changes
nothing:

    %S = gemm(%Q.2, %K.4)   where %Q.2 is in shared memory and `gemm` has 2 operands: ok
    %K.4 = copy(%K.3) {src_space = global, …}  where %K.3 is in shared: error
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from tlc.frontend.names import identifier_problem
from tlc.ir.graph import Graph
from tlc.ir.ops import ELEMENTWISE, AllocateOp, CopyOp, ElementwiseOp, GemmOp, LoopOp, MaskOp, Op, ReshapeOp, SoftmaxOp
from tlc.ir.types import SPACES
from tlc.ir.verify import verify_structure
from tlc.passes.base import Pass, PassContext

_REGISTER_ONLY = (ElementwiseOp, MaskOp, SoftmaxOp, ReshapeOp)

# What the lowering of every target builds as the operand of a Compute or Reshape (tlc.lowering.tile_ops'
# slot kinds frag, row and scalar). The TL check and the build's refusal (tlc.builder) both end with it, so
# the first refusal a user meets names what works rather than a copy that the next stage refuses.
LOWERED_OPERANDS = ("the sm_80-family and sm_90a lowerings take GEMM results, values computed from them, softmax "
                    "row statistics and scalars as Compute and Reshape operands, not tiles loaded from memory "
                    "in a kernel with GEMMs (an additive bias or a mask tensor is not supported yet)")
_TL_FN = {fn: tl.title() for tl, (fn, _) in reversed(ELEMENTWISE.items())}  # the first TL spelling of each


def statement(op: Op) -> str:
    """How the TL statement of a register-only op starts: `Compute Add`, `Compute Softmax`, `Reshape`."""
    if isinstance(op, ElementwiseOp):
        return f"Compute {_TL_FN.get(op.fn, op.fn)}"
    return {MaskOp: "Compute Mask", SoftmaxOp: "Compute Softmax", ReshapeOp: "Reshape"}.get(type(op), op.mnemonic)


@dataclass(frozen=True)
class VerifyPass(Pass):
    name: ClassVar[str] = "verify"

    def apply(self, ctx: PassContext, graph: Graph) -> None:
        found = [(loc, msg) for msg, loc in verify_structure(graph)]
        globals_seen: dict[str, Op] = {}
        for _, op in graph.walk():
            found += [(op.loc, msg) for msg in _problems(op, globals_seen)]
        for loc, msg in sorted(found, key=lambda f: (f[0].line, f[0].col) if f[0] else (0, 0)):
            ctx.error(msg, loc)


def _problems(op: Op, globals_seen: dict[str, Op]) -> list[str]:
    out: list[str] = []
    for v in (*op.results, *op.operands):
        problem = identifier_problem(v.base)
        if problem:
            out.append(problem)
    if isinstance(op, AllocateOp) and op.space == "global":
        first = globals_seen.setdefault(op.name, op)
        if first is not op:
            out.append(f"global tensor '{op.name}' is allocated twice (first at line {first.loc.line})")
    if isinstance(op, CopyOp) and op.operands:
        have = op.operands[0].type.space
        if have in SPACES and have != op.src_space:
            out.append(f"copy from {op.src_space} reads '{op.operands[0].base}', which is in {have} memory")
        if op.dst_space == "global" and len(op.operands) == 2 and op.operands[1].type.space != "global":
            out.append(f"a store to global needs a global tensor, not {op.operands[1].type.space} "
                       f"'{op.operands[1].base}'")
    if isinstance(op, GemmOp):
        for v, role in zip(op.operands, ("A", "B", "accumulator")):
            if v.type.space not in ("shared", "register"):
                out.append(f"the {role} operand '{v.base}' of a GEMM is in {v.type.space} memory; "
                           "GEMM operands live in shared memory or registers")
    if isinstance(op, _REGISTER_ONLY):
        for v in op.operands:
            if v.type.space in ("global", "shared"):
                out.append(f"{statement(op)} reads '{v.base}' from {v.type.space} memory; as TL it needs a copy "
                           f"to registers, but no target builds that: {LOWERED_OPERANDS}")
    if isinstance(op, LoopOp) and (op.start is None or op.stop is None or op.body is None):
        out.append(f"loop '{op.var}' needs a start, a bound and a body")
    return out
