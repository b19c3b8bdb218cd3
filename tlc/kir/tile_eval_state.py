"""Tile evaluator: the values kernel-IR names denote at tile level and one CTA's state.

A partition is the tensor it partitions (`partition_S/D/A/B/C`, `retile_S/D` only record the
thread slice and add CuTe's third leading mode), so `tKsK[_, _, _, s]` is stage s of sK and
`tKgK[_, _, _, n, 0]` is tile (n, 0) of gK. Handlers register per op class in `HANDLERS`.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable

import torch

from tlc.diagnostics import Loc, Note, TlcError, error
from tlc.kir import ops as K
from tlc.kir.evaluate import evaluate
from tlc.kir.expr import Expr, Index, Var
from tlc.kir.tile_eval_expr import F64, TileFault, round_to
from tlc.kir.tile_eval_smem import Key, SharedMemory


class TileEvalError(TlcError):
    """The kernel IR does something with no defined result at tile level (a race, an out-of-bounds
    access, an unknown op), reported at the TL line of the op."""

    def __init__(self, message: str, loc: Loc | None = None, *notes: Note) -> None:
        super().__init__(error(f"tile-eval: {message}", loc, *notes))


# ----------------------------------------------------------------------------- values
@dataclass(frozen=True)
class GlobalView:
    """One (batch, head) slice of a bound tensor: (rows, real cols), or (rows,) for a vector."""

    name: str
    data: torch.Tensor
    cols: int       # the kernel's width (padded past the real columns); 0 for a vector
    dtype: str
    owner: torch.Tensor | None = None   # outputs: which CTA stored each element (-1: none yet)
    gathered: bool = False   # rows gathered through a row map: only a gather copy may read it
    # a gathered output: (the head's storage (rows, cols), its owners, the storage row of each row): stores go there
    scatter: tuple | None = None


@dataclass(frozen=True)
class Window:
    """One tile of a global view at element `start`; reads and writes are bounds-checked."""

    view: GlobalView
    start: tuple[int, ...]
    shape: tuple[int, ...]
    rank: int = 2
    slice: str = ""


@dataclass(frozen=True)
class GlobalTiles:
    """`local_tile(view, tile, coord)` with some coordinates left as `_` (None) to index later."""

    view: GlobalView
    tile: tuple[int, ...]
    coord: tuple[int | None, ...]
    rank: int = 2
    slice: str = ""
    row_shift: int = 0    # the tiles start this many rows before the view's first row


@dataclass(frozen=True)
class SharedRef:
    """A shared buffer (or a view of it), `stage` chosen once the stage mode is indexed."""

    buffer: str
    transposed: bool
    stages: int          # 0: the buffer has no stage mode
    stage: int | None = None
    rank: int = 2
    slice: str = ""

    def key(self) -> Key:
        if self.stages and self.stage is None:
            raise TileFault(f"uses every stage of {self.buffer} at once; index its stage mode")
        return (self.buffer, self.stage)


@dataclass(frozen=True)
class Coords:
    """An identity tile: element (i, j) is coordinate (i, j)."""

    shape: tuple[int, int]
    rank: int = 2
    slice: str = ""


@dataclass
class Frag:
    """Registers: a tile (M, N) or a row vector (M,). Partitions share `data` (aliases)."""

    data: torch.Tensor
    dtype: str
    role: str            # "C" accumulator, "A" operand (retiled accumulator), "row" vector
    origin: str
    rank: int = 2
    slice: str = ""


@dataclass(frozen=True)
class OperandFrag:
    """An A/B operand fragment shaped like shared `src`, filled one k-block at a time by the
    GEMM's S2R loads: `blocks[kb]` is what k-block kb's registers hold (views share the dict)."""

    src: SharedRef
    role: str
    mma: str
    origin: str
    rank: int = 2
    slice: str = ""
    blocks: dict = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True)
class Bound:
    """A tensor of the launch: float64 (batch, heads, rows, cols) storage; `owner` for outputs."""

    name: str
    dtype: str
    storage: torch.Tensor
    owner: torch.Tensor | None


TileValue = GlobalView | Window | GlobalTiles | SharedRef | Coords | Frag | OperandFrag
HANDLERS: dict[type, Callable[["Block", Any], None]] = {}


def handles(*classes: type) -> Callable:
    def register(fn: Callable) -> Callable:
        for cls in classes:
            HANDLERS[cls] = fn
        return fn
    return register


def partitioned(v: TileValue, slice_: str) -> TileValue:
    if isinstance(v, GlobalView):
        raise TileFault(f"partitions global tensor {v.name} itself; partition a local_tile of it")
    return replace(v, rank=3, slice=slice_)


# ----------------------------------------------------------------------------- global windows
def tile_start(coord: tuple[int, ...], tile: tuple[int, ...], row_shift: int = 0) -> tuple[int, ...]:
    """The element where tile `coord` of a local_tile starts (its rows `row_shift` earlier)."""
    return tuple(c * t - (row_shift if axis == 0 else 0) for axis, (c, t) in enumerate(zip(coord, tile)))


def _extent(w: Window, limits: tuple[int | None, ...], row_first: int | None = None) -> tuple[slice, ...]:
    """The tile-local span of each axis a predicated copy touches: [first, limit), clipped to the tile."""
    out = []
    for axis, (size, limit) in enumerate(zip(w.shape, limits)):
        lo = max(0, min(size, row_first)) if axis == 0 and row_first is not None else 0
        hi = max(lo, size if limit is None else min(size, limit))
        real = w.view.data.shape[axis]
        if hi > lo and not 0 <= w.start[axis] + lo <= w.start[axis] + hi <= real:
            what = ("rows", "columns")[axis]
            raise TileFault(f"touches {what} {w.start[axis] + lo}..{w.start[axis] + hi - 1} of {w.view.name}, which has "
                            f"{real} {what}: the copy needs a predicate (row_limit / row_first / col_limit) there")
        out.append(slice(lo, hi))
    return tuple(out)


def read_window(w: Window, row_limit: int | None, col_limit: int | None, row_first: int | None = None) -> torch.Tensor:
    """The tile, elements at or past the limits (or before `row_first`) zero-filled (cp.async's src-size 0)."""
    local = _extent(w, (row_limit, col_limit), row_first)
    out = torch.zeros(w.shape, dtype=F64)
    region = tuple(slice(s + k.start, s + k.stop) for s, k in zip(w.start, local))
    out[local] = w.view.data[region]
    return out


def write_window(w: Window, value: torch.Tensor, row_limit: int | None, col_limit: int | None, cta: int,
                 row_first: int | None = None, add: bool = False) -> None:
    """Store the tile (rounded to the tensor's dtype), skipping elements at or past the limits (or
    before `row_first`). Only outputs are writable, and no element by two CTAs (that is a race between them),
    unless every write adds (`add`: atomic adds, summed in whatever order the CTAs come)."""
    if tuple(value.shape) != w.shape:
        raise TileFault(f"stores a {tuple(value.shape)} tile into a {w.shape} window of {w.view.name}")
    if w.view.owner is None:
        raise TileFault(f"stores into {w.view.name}, an input of the kernel")
    local = _extent(w, (row_limit, col_limit), row_first)
    region = tuple(slice(s + k.start, s + k.stop) for s, k in zip(w.start, local))
    owner = w.view.owner[region]
    if add:   # -2: added into; a plain store by any CTA there is then a race with the adds
        if (owner >= 0).any():
            raise TileFault(f"adds into elements of {w.view.name} that a CTA stored (a race: stored and added)")
        owner.fill_(-2)
        w.view.data[region] = round_to(w.view.data[region] + value[local], w.view.dtype)
        return
    if (owner == -2).any():
        raise TileFault(f"stores elements of {w.view.name} that CTAs add into (a race: stored and added)")
    others = owner[(owner >= 0) & (owner != cta)]
    if others.numel():
        raise TileFault(f"stores elements of {w.view.name} that CTA #{int(others[0])} stored too (a race between "
                        "CTAs: their tiles overlap)")
    if w.view.scatter is not None:
        _scatter(w, value[local], region, cta)
        return
    owner.fill_(cta)
    w.view.data[region] = round_to(value[local], w.view.dtype)


def _scatter(w: Window, value: torch.Tensor, region: tuple[slice, ...], cta: int) -> None:
    """A store into a gathered output: each row into the storage row its map gave (none outside the storage),
    two rows of one tile or two CTAs writing one storage row a race."""
    storage, owners, index = w.view.scatter
    written: set[int] = set()
    for i, r in enumerate(range(region[0].start, region[0].stop)):
        at = int(index[r])
        if not 0 <= at < storage.shape[0]:
            continue
        if at in written:   # two threads of one CTA store one storage row: which lands is undefined
            raise TileFault(f"stores two rows of one tile to row {at} of {w.view.name}'s storage (a race: two rows map "
                            "to one storage row)")
        written.add(at)
        owner = owners[at, region[1]]
        others = owner[(owner >= 0) & (owner != cta)]
        if others.numel():
            raise TileFault(f"stores row {at} of {w.view.name}'s storage, which CTA #{int(others[0])} stored too (a "
                            "race: two rows map to one storage row)")
        owner.fill_(cta)
        storage[at, region[1]] = round_to(value[i], w.view.dtype)
        w.view.data[r, region[1]] = storage[at, region[1]]


# ----------------------------------------------------------------------------- one CTA
class Block:
    """One program instance (a CTA): scalars, named tile values, shared memory; `run` executes ops."""

    def __init__(self, scalars: dict[str, Any], tensors: dict[str, Bound], cta: int) -> None:
        self.scalars = scalars
        self.tensors = tensors          # p.<ptr field> → the tensor bound to it
        self.cta = cta                  # linear CTA index, recorded with each global store
        self.values: dict[str, TileValue] = {}
        self.smem = SharedMemory()
        self.layouts: dict[str, tuple[int, ...]] = {}
        self.transpose_of: dict[str, str] = {}
        self.copies: dict[str, K.TiledCopyOp] = {}
        self.mmas: dict[str, K.TiledMmaOp] = {}
        self.slices: set[str] = set()

    def run(self, ops: tuple[K.Op, ...]) -> None:
        for op in ops:
            # The nearest class with a handler: a fold-partitions view is read as the op it replaced.
            handler = next((HANDLERS[c] for c in type(op).__mro__ if c in HANDLERS), None)
            if handler is None:
                raise TileEvalError(f"{type(op).__name__} has no tile-level meaning here (the evaluator knows "
                                    f"{', '.join(sorted(c.__name__ for c in HANDLERS))})", op.loc)
            try:
                handler(self, op)
            except TileEvalError:
                raise
            except TileFault as exc:
                raise TileEvalError(f"{type(op).__name__}: {exc}", op.loc) from None
            except TlcError as exc:
                raise TileEvalError(f"{type(op).__name__}: {exc.diagnostics[0].message}", op.loc) from None

    # ------------------------------------------------------------------ lookups
    def scalar(self, e: Expr) -> Any:
        return evaluate(e, self.scalars)

    def integer(self, e: Expr | None) -> int | None:
        if e is None:
            return None
        v = self.scalar(e)
        if isinstance(v, float) and not v.is_integer():
            raise TileFault(f"`{e}` = {v} is not an integer")
        return int(v)

    def value(self, name: str) -> TileValue:
        if name not in self.values:
            raise TileFault(f"{name!r} is not a tensor defined before this op")
        return self.values[name]

    def frag(self, name: str, dims: int | None = None) -> Frag:
        v = self.value(name)
        if not isinstance(v, Frag) or (dims is not None and v.data.dim() != dims):
            want = {1: "a row vector", 2: "a register tile"}.get(dims or 0, "registers")
            raise TileFault(f"{name} is {type(v).__name__}, not {want}")
        return v

    def resolve(self, e: Expr) -> TileValue:
        """A tensor expression: a name, or a slice `t[_, …, i, j]` whose leading `_`s are the tile."""
        if isinstance(e, Var):
            return self.value(e.name)
        if not isinstance(e, Index):
            raise TileFault(f"`{e}` is not a tensor")
        v = self.resolve(e.base)
        lead = next((i for i, x in enumerate(e.indices) if x != Var("_")), len(e.indices))
        picks = e.indices[lead:]
        if lead != v.rank or any(x == Var("_") for x in picks):
            raise TileFault(f"`{e}` slices {e.base.name} with {lead} leading `_` but it has {v.rank} tile modes")
        sel = [self.integer(x) for x in picks]
        if isinstance(v, GlobalTiles):
            free = [i for i, c in enumerate(v.coord) if c is None]
            if len(sel) != len(free):
                raise TileFault(f"`{e}` gives {len(sel)} tile coordinates, {e.base.name} iterates {len(free)}")
            coord = list(v.coord)
            for i, s in zip(free, sel):
                coord[i] = s
            return Window(v.view, tile_start(tuple(coord), v.tile, v.row_shift), v.tile, v.rank, v.slice)
        if isinstance(v, SharedRef) and v.stages and v.stage is None and len(sel) == 1:
            if not 0 <= sel[0] < v.stages:
                raise TileFault(f"`{e}` selects stage {sel[0]} of {v.buffer}, which has {v.stages}")
            return replace(v, stage=sel[0])
        raise TileFault(f"`{e}`: {e.base.name} has no mode left to index")

    def shared(self, e: Expr) -> SharedRef:
        v = self.resolve(e)
        if not isinstance(v, SharedRef):
            raise TileFault(f"`{e}` is {type(v).__name__}, not shared memory")
        v.key()
        return v

    def shared_shape(self, ref: SharedRef) -> tuple[int, int]:
        t = self.smem.data[ref.buffer]
        rows, cols = t.shape[0], t.shape[1]
        return (cols, rows) if ref.transposed else (rows, cols)

    def read_shared(self, ref: SharedRef) -> torch.Tensor:
        return self.smem.read(ref.key(), ref.transposed)
