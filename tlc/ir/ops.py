"""TL-graph ops: one frozen dataclass per statement kind, plus the explicit forms that
passes introduce (row reductions, scaled exp2, fills).

Every op has `results`, `operands`, a `loc` pointing at its `.tl` line and a `verify()`
for structure. Attributes are the other fields; the printer and IR parser handle every
op generically through `attrs()`, so adding an op is adding a class.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from functools import reduce
from typing import TYPE_CHECKING, Any, ClassVar

from tlc.diagnostics import UNKNOWN_LOC, Loc
from tlc.expr import BinOp, Expr, Var
from tlc.ir.types import SPACES, Value

if TYPE_CHECKING:
    from tlc.ir.graph import Graph

_STRUCTURAL = {"results", "operands", "loc", "body", "args", "yields"}


@dataclass(frozen=True, eq=False)
class Op:
    results: tuple[Value, ...]
    operands: tuple[Value, ...]
    loc: Loc = field(default=UNKNOWN_LOC, kw_only=True)

    mnemonic: ClassVar[str] = "op"
    has_effect: ClassVar[bool] = False
    n_operands: ClassVar[tuple[int, ...] | None] = None
    n_results: ClassVar[tuple[int, ...] | None] = (1,)
    # attributes printed only when they differ from their default (rarely set ones)
    quiet_defaults: ClassVar[tuple[str, ...]] = ()

    def attrs(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _STRUCTURAL
                and not (f.name in self.quiet_defaults and getattr(self, f.name) == f.default)}

    @property
    def result(self) -> Value:
        return self.results[0]

    def verify(self) -> list[str]:
        msgs = []
        if self.n_operands is not None and len(self.operands) not in self.n_operands:
            msgs.append(f"'{self.mnemonic}' takes {' or '.join(map(str, self.n_operands))} operands, "
                        f"got {len(self.operands)}")
        if self.n_results is not None and len(self.results) not in self.n_results:
            msgs.append(f"'{self.mnemonic}' has {' or '.join(map(str, self.n_results))} results, got {len(self.results)}")
        return msgs


@dataclass(frozen=True, eq=False)
class AllocateOp(Op):
    """`Allocate Q in global (seqlen_q, HeadDim) [as bf16] [with offset head_idx / group]`.

    Global: binds the runtime tensor of that name (one (rows, cols) slice per batch and
    head, the head chosen by `offset`). Shared: a buffer. Register: a zero-filled tile."""

    name: str = ""
    space: str = "register"
    shape: tuple[Expr, ...] = ()
    dtype: str | None = None
    offset: Expr | None = None
    # global: the storage row of the tensor's row `row` (`with rows at E`, tlc/ir/row_maps.py); None: row `row`
    rows_at: Expr | None = None
    mnemonic: ClassVar[str] = "allocate"
    quiet_defaults: ClassVar[tuple[str, ...]] = ("rows_at",)
    n_operands: ClassVar[tuple[int, ...] | None] = (0,)

    @property
    def has_effect(self) -> bool:  # type: ignore[override]
        return self.space != "register"

    def verify(self) -> list[str]:
        msgs = super().verify()
        if self.space not in SPACES:
            msgs.append(f"unknown memory space '{self.space}'")
        return msgs


@dataclass(frozen=True, eq=False)
class CopyOp(Op):
    """`Copy K (BN, HeadDim) in coordinate [L = n] from global to shared`.

    `oob` says what a load does past the tensor's end: `absent` (the language's meaning:
    those elements do not exist) or `zero` (the kernel's: zero-filled, masked later).
    `from_end`: the row tile L counts from the tensor's end (`[L = block_idx from end]`): rows
    `extent − (L+1)·r … extent − L·r − 1`, so a partial tile is the first one, not the last."""

    src_space: str = "global"
    dst_space: str = "shared"
    tile: tuple[Expr, ...] | None = None
    coord: tuple[tuple[str, Expr], ...] = ()
    oob: str = "absent"
    from_end: bool = False
    add: bool = False   # a reduce-store: the tile is added into the global tensor (which starts at zero)
    mnemonic: ClassVar[str] = "copy"
    quiet_defaults: ClassVar[tuple[str, ...]] = ("from_end", "add")
    has_effect: ClassVar[bool] = True
    n_operands: ClassVar[tuple[int, ...] | None] = (1, 2)

    def verify(self) -> list[str]:
        msgs = super().verify()
        for s in (self.src_space, self.dst_space):
            if s not in SPACES:
                msgs.append(f"unknown memory space '{s}'")
        if self.oob not in ("absent", "zero"):
            msgs.append(f"oob must be absent or zero, not '{self.oob}'")
        if self.dst_space == "global" and len(self.operands) != 2:
            msgs.append("a store to global takes the tile and the global tensor")
        if self.add and (self.src_space, self.dst_space) != ("register", "global"):
            msgs.append("only a store from register to global adds into its target")
        return msgs


@dataclass(frozen=True, eq=False)
class ScalarOp(Op):
    """A scalar from an expression over params and runtime inputs (`scale`, `30.0`)."""

    expr: Expr | None = None
    mnemonic: ClassVar[str] = "scalar"
    n_operands: ClassVar[tuple[int, ...] | None] = (0,)


@dataclass(frozen=True, eq=False)
class GemmOp(Op):
    """`Compute GEMM A, B[.T] and get|accumulate C`: C (+)= op(A) · op(B)."""

    trans_a: bool = False
    trans_b: bool = False
    accumulate: bool = False
    # Set by resolve-transpose: which dimension of the stored operand tile is contiguous.
    # "k": the MMA reads it as is (plain ldmatrix); "mn": it needs a transposing load
    # (ldmatrix.trans), as V in P·V. None: not resolved yet.
    a_major: str | None = None
    b_major: str | None = None
    mnemonic: ClassVar[str] = "gemm"
    n_operands: ClassVar[tuple[int, ...] | None] = (2, 3)

    def verify(self) -> list[str]:
        msgs = super().verify()
        if self.accumulate != (len(self.operands) == 3):
            msgs.append("an accumulating gemm takes the accumulator as its third operand")
        for side, major in (("a", self.a_major), ("b", self.b_major)):
            if major not in (None, "k", "mn"):
                msgs.append(f"{side}_major must be k or mn, not '{major}'")
        return msgs


ELEMENTWISE = {  # TL spelling (lower case) → (ir fn, arity)
    "add": ("add", 2), "subtract": ("sub", 2), "sub": ("sub", 2), "multiply": ("mul", 2), "mul": ("mul", 2),
    "divide": ("div", 2), "div": ("div", 2), "max": ("max", 2), "maximum": ("max", 2), "min": ("min", 2),
    "minimum": ("min", 2), "exp": ("exp", 1), "exp2": ("exp2", 1), "log": ("log", 1), "tanh": ("tanh", 1),
    "relu": ("relu", 1), "negate": ("neg", 1), "neg": ("neg", 1), "abs": ("abs", 1), "sqrt": ("sqrt", 1),
    "square": ("square", 1),
}
IR_FNS = {fn: arity for fn, arity in ELEMENTWISE.values()}


@dataclass(frozen=True, eq=False)
class ElementwiseOp(Op):
    """`Compute Multiply S, scale and get new S`; row vectors broadcast along columns.
    Division by zero gives 0 (a fully masked row divided by its zero sum is 0)."""

    fn: str = "add"
    mnemonic: ClassVar[str] = "elementwise"

    def verify(self) -> list[str]:
        msgs = super().verify()
        if self.fn not in IR_FNS:
            msgs.append(f"unknown elementwise function '{self.fn}'")
        elif len(self.operands) != IR_FNS[self.fn]:
            msgs.append(f"'{self.fn}' takes {IR_FNS[self.fn]} operands, got {len(self.operands)}")
        return msgs


@dataclass(frozen=True, eq=False)
class SoftmaxOp(Op):
    """`Compute Softmax S [with max m, sum l] [and get P]` over the enclosing loop's whole
    domain. Results: P, the row max m and the row sum l of exp(S - m) over the domain.
    `normalized`: P = exp(S - m) / l; otherwise P = exp(S - m) and the program divides."""

    normalized: bool = True
    mnemonic: ClassVar[str] = "softmax"
    n_operands: ClassVar[tuple[int, ...] | None] = (1,)
    n_results: ClassVar[tuple[int, ...] | None] = (3,)


@dataclass(frozen=True, eq=False)
class MaskOp(Op):
    """`Compute Mask S causal top_left` or `Compute Mask S where kv_idx > q_idx` — sets masked scores to -inf.

    kind `causal`: key col > query row (+ seqlen_k - seqlen_q when bottom_right).
    kind `bounds`: col >= `limit` (explicit form of absent elements, from the mask pass).
    kind `predicate`: where `predicate` is true, with q_idx the score's global query row and kv_idx its
    global key column.
    The trips it applies in (set by the mask pass, which proved the others have nothing to mask):
    `from_iteration` `[n = e]`, the trips with n >= e; `until_iteration` `[n = u]`, those with n < u; with
    both, either; with neither, every trip (`trips()`)."""

    kind: str = "causal"
    alignment: str = "top_left"
    limit: Expr | None = None
    from_iteration: tuple[tuple[str, Expr], ...] = ()
    predicate: Expr | None = None
    until_iteration: tuple[tuple[str, Expr], ...] = ()
    mnemonic: ClassVar[str] = "mask"
    quiet_defaults: ClassVar[tuple[str, ...]] = ("predicate", "until_iteration")
    n_operands: ClassVar[tuple[int, ...] | None] = (1,)

    def attrs(self) -> dict[str, Any]:
        """A predicate mask prints its kind and predicate (and a `from_iteration` if one is set) only."""
        out = super().attrs()
        if self.kind == "predicate":
            for name in ("alignment", "limit") + (() if self.from_iteration else ("from_iteration",)):
                out.pop(name)
        return out

    def trips(self) -> Expr | None:
        """The condition on the loop variables under which the mask applies; None: in every trip."""
        late = [BinOp(">=", Var(v), e) for v, e in self.from_iteration]
        early = [BinOp("<", Var(v), e) for v, e in self.until_iteration]
        parts = ([reduce(lambda a, b: BinOp("&&", a, b), late)] if late else []) + early
        return reduce(lambda a, b: BinOp("||", a, b), parts) if parts else None

    def verify(self) -> list[str]:
        msgs = super().verify()
        if self.kind not in ("causal", "bounds", "predicate"):
            msgs.append(f"unknown mask kind '{self.kind}'")
        if self.kind == "causal" and self.alignment not in ("top_left", "bottom_right"):
            msgs.append(f"causal alignment must be top_left or bottom_right, not '{self.alignment}'")
        if (self.kind == "predicate") != (self.predicate is not None):
            msgs.append("a predicate mask (and only it) has a predicate")
        return msgs


@dataclass(frozen=True, eq=False)
class ReshapeOp(Op):
    """`Reshape P from (MMA_C, MMA_M, MMA_N) to (MMA_A, MMA_M, MMA_N) as bf16`: the same
    values in another fragment layout and element type."""

    src_modes: tuple[str, ...] = ()
    dst_modes: tuple[str, ...] = ()
    dtype: str | None = None
    mnemonic: ClassVar[str] = "reshape"
    n_operands: ClassVar[tuple[int, ...] | None] = (1,)


@dataclass(frozen=True, eq=False)
class FullOp(Op):
    """A register tile or row vector filled with one value (running max starts at -inf)."""

    value: float = 0.0
    shape: tuple[Expr, ...] = ()
    dtype: str | None = "fp32"
    mnemonic: ClassVar[str] = "full"
    n_operands: ClassVar[tuple[int, ...] | None] = (0,)


@dataclass(frozen=True, eq=False)
class RowReduceOp(Op):
    """Row max or row sum of a tile → a row vector (absent elements ignored)."""

    fn: str = "max"
    mnemonic: ClassVar[str] = "row_reduce"
    n_operands: ClassVar[tuple[int, ...] | None] = (1,)


@dataclass(frozen=True, eq=False)
class ScaledExpOp(Op):
    """exp2(x·s − m·s) with m a row vector and s a scalar (FlashAttention's scale folded
    with log2 e). Where m = −inf (row fully masked so far) the subtrahend is 0, so the
    result is 0, never NaN."""

    mnemonic: ClassVar[str] = "scaled_exp2"
    n_operands: ClassVar[tuple[int, ...] | None] = (3,)


@dataclass(frozen=True, eq=False)
class LoopOp(Op):
    """`for n = 0:N` … `end`. The trip count is ceil(N) - start (division in a bound
    rounds up, so a partial last tile runs). `args` = (n, carried…); `yields` feed the
    next iteration; `results` are the carried values after the loop. Yields and results
    past the carried ones are exports: a softmax's domain statistics, the same in every
    iteration, visible after the loop."""

    var: str = "n"
    start: Expr | None = None
    stop: Expr | None = None
    body: "Graph | None" = None
    args: tuple[Value, ...] = ()
    yields: tuple[Value, ...] = ()
    mnemonic: ClassVar[str] = "loop"
    n_results: ClassVar[tuple[int, ...] | None] = None

    @property
    def has_effect(self) -> bool:  # type: ignore[override]
        return self.body is not None and any(op.has_effect for op in self.body.ops())

    def verify(self) -> list[str]:
        msgs = super().verify()
        carried = len(self.args) - 1
        if not (len(self.operands) == carried and len(self.yields) == len(self.results) >= carried):
            msgs.append(f"loop '{self.var}' carries {carried} values but has {len(self.operands)} inits, "
                        f"{len(self.yields)} yields and {len(self.results)} results")
        return msgs


OP_CLASSES: dict[str, type[Op]] = {
    cls.mnemonic: cls
    for cls in (AllocateOp, CopyOp, ScalarOp, GemmOp, ElementwiseOp, SoftmaxOp, MaskOp, ReshapeOp, FullOp,
                RowReduceOp, ScaledExpOp, LoopOp)
}
