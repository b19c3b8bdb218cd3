"""`Compute Mask` → the TL graph's `MaskOp`: a causal mask with its alignment, or a predicate mask whose
names are checked here (LANGUAGE.md §5, Compute Mask).

A predicate reads the score's positions (`q_idx`, `kv_idx`), `head_idx`, `batch_idx`, `group`, numeric
Params and Inputs: what is the same for every score of a head, or follows from its position. A loop
variable or `block_idx` says which tile a score is in, not where it is, so a predicate may not read them
(it would mean something else with other tile sizes); a tile is not a scalar.
"""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from tlc.frontend import ast as A
from tlc.frontend.names import BUILTINS, MASK_POSITIONS
from tlc.ir.ops import MaskOp
from tlc.ir.tensor_inputs import scalar_names
from tlc.ir.types import TileType

if TYPE_CHECKING:
    from tlc.frontend.lower import Lowerer

ALIGNMENTS = ("top_left", "bottom_right")
PREDICATE_INDICES = ("head_idx", "batch_idx", "group")   # the built-in indices a predicate may read
_READS = "q_idx, kv_idx, head_idx, batch_idx, group, numeric Params and Inputs"


def lower_mask(lw: Lowerer, s: A.MaskStmt) -> None:
    if s.predicate is not None:
        if not _check_predicate(lw, s.predicate, s.predicate_loc):
            return
        kind = {"kind": "predicate", "predicate": s.predicate}
    else:
        if s.alignment in lw.graph.params:  # `causal Align` with `Param Align = top_left`
            s = replace(s, alignment=str(lw.graph.params[s.alignment]))
        if s.alignment not in ALIGNMENTS:
            lw.err(f"causal alignment must be top_left (as SDPA) or bottom_right (as FlashAttention >= 2.1), "
                   f"not '{s.alignment}'", s.alignment_loc)
            return
        kind = {"kind": "causal", "alignment": s.alignment}
    x = lw.operand(s.x, s.x_loc, "the Mask input")
    name = lw.result_name(s.out, s.new, s.x, s.loc)
    if x is None or name is None:
        return
    v = lw.fresh(name, TileType("register", None, x.type.dtype))
    lw.emit(MaskOp((v,), (x,), loc=s.loc, **kind))
    lw.define(name, "register", v, s.loc)


def _check_predicate(lw: Lowerer, e: A.Expr, loc) -> bool:
    """Report every name the predicate may not read; True when it reads only what it may."""
    ok = lw.check_loads(e, loc, "the mask predicate", True)
    for n in sorted(scalar_names(e) - set(lw.graph.tensor_inputs)):
        problem = _name_problem(lw, n)
        if problem:
            lw.err(problem, loc)
            ok = False
    lw.check_divisors(e, loc, "the mask predicate")
    return ok


def _name_problem(lw: Lowerer, n: str) -> str | None:
    params = lw.graph.params
    if n in MASK_POSITIONS or n in PREDICATE_INDICES or n in lw.graph.inputs:
        return None
    if n in params:
        value = params[n]
        if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)):
            return None
        fix = f"guard the statement with 'when {n}' instead" if isinstance(value, bool) else "use a number"
        return f"Param '{n}' = {str(value).lower()} is not a number, so a mask predicate cannot compare it; {fix}"
    if n in BUILTINS or n in lw.loop_vars:
        what = "the query tile's index" if n == "block_idx" else "a loop variable"
        return (f"'{n}' is {what}: a mask predicate reads where a score is, not which tile holds it; write the "
                f"position with q_idx (the query row) or kv_idx (the key column)")
    if lw.sketch:
        return None
    if lw.lookup(n) is not None:
        return f"'{n}' is a tile, but a mask predicate reads {_READS}"
    return (f"undefined name '{n}' in the mask predicate{lw.suggest(n, [*params, *lw.graph.inputs, *MASK_POSITIONS])}; "
            "declare it with 'Param' or 'Input'")
