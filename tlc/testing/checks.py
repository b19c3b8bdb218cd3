"""Reference checkers: run a TL program on concrete shapes and compare it with an oracle
(tlc.testing.oracle: its `Param Variant`'s float64 reference, the user's reference, or the
program as written) under docs/correctness.md's 1e-6 relative bound for interpreter checks,
reporting the max error and where it is (batch, head, row).

A program's global tensors are sized from its own `Allocate … in global` lines, so any
program whose extents are runtime `Input`s can be checked without a per-spec table.
"""
from __future__ import annotations

import functools
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from tlc.diagnostics import TlcError
from tlc.numbers import INT32_MAX, parse_float, parse_int
from tlc.expr import Expr, ExprError, eval_expr, free_names
from tlc.frontend.lower import lower_program
from tlc.frontend.parser import parse_file, parse_text
from tlc.ir.graph import Graph
from tlc.ir.heads import last_head
from tlc.ir.interpreter import InterpError, run_program
from tlc.ir.ops import AllocateOp, CopyOp, ReshapeOp
from tlc.ir.tensor_inputs import launch_sizes, stored_rows, tensor_shape
from tlc.reference import KNOWN_VARIANTS, known_variant
from tlc.testing.oracle import Oracle, Output, Reference, ReferenceProblem, oracle_for, variant_oracle

RTOL = 1e-6

ProgramLike = Graph | str | os.PathLike


# ------------------------------------------------------------------ shapes


@dataclass
class Shapes:
    """One concrete problem size: batch, query heads, KV heads and the runtime inputs."""

    batch: int = 1
    heads: int = 1
    kv_heads: int = 1
    ints: dict[str, int] = field(default_factory=dict)
    floats: dict[str, float] = field(default_factory=dict)

    def describe(self) -> str:
        parts = [f"batch={self.batch}", f"heads={self.heads}", f"kv_heads={self.kv_heads}"]
        parts += [f"{k}={v}" for k, v in self.ints.items()]
        parts += [f"{k}={v!r}" for k, v in self.floats.items()]
        return " ".join(parts)

    def replay_text(self) -> str:
        return self.describe().replace(" ", ",")

    @classmethod
    def from_replay(cls, text: str) -> "Shapes":
        """Inverse of `replay_text`: `batch=1,heads=2,kv_heads=1,seqlen_q=3,scale=0.5`."""
        s = cls()
        for item in filter(None, (t.strip() for t in text.split(","))):
            key, _, raw = item.partition("=")
            if key in ("batch", "heads", "kv_heads"):
                setattr(s, key, parse_int(raw, f"replay size {key}", minimum=1))
            elif re.fullmatch(r"-?[0-9]+", raw.strip(), re.ASCII):
                s.ints[key] = parse_int(raw, f"replay size {key}", minimum=-INT32_MAX)
            else:
                s.floats[key] = parse_float(raw, f"replay value {key}")
        return s


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dims: tuple[Expr, ...]
    heads: str            # "q" (one per query head), "kv" (offset uses group) or "one"
    transposed: bool      # stored (cols, seq) although the reference wants (seq, cols)
    output: bool
    added: bool = False   # stored by `and add` (a reduce-store): it starts at zero, not NaN
    head_last: Expr | None = None   # an offset reading a grid axis or a loop's variable, at their last values
    gathered: bool = False          # read through a row map: a storage the batch shares (tlc/ir/row_maps.py)

    def head_count(self, shapes: "Shapes", env: Mapping[str, Any]) -> int:
        """The tensor's heads at `shapes`: by its kind, or one past its last head (tlc/ir/heads.py)."""
        if self.head_last is None:
            return {"q": shapes.heads, "kv": shapes.kv_heads, "one": 1}[self.heads]
        return int(eval_expr(self.head_last, dict(env, head_idx=shapes.heads - 1,
                                                  group=max(shapes.heads // max(shapes.kv_heads, 1), 1)))) + 1


@dataclass(frozen=True)
class ProgramInfo:
    """What a checker needs to know about a program to feed it."""

    tensors: tuple[TensorInfo, ...]
    int_inputs: tuple[str, ...]
    float_inputs: tuple[str, ...]
    max_tile: int
    has_reshape: bool
    length_tiles: Mapping[str, tuple[int, ...]] = field(default_factory=dict)  # int Input → tiles stepping over it


def program_info(graph: Graph) -> ProgramInfo:
    ints = tuple(n for n, k in graph.inputs.items() if k == "int")
    floats = tuple(n for n, k in graph.inputs.items() if k != "int")
    stored = {op.operands[1].base for _, op in graph.walk() if isinstance(op, CopyOp) and op.dst_space == "global"}
    added = {op.operands[1].base for _, op in graph.walk() if isinstance(op, CopyOp) and op.add}
    tensors = []
    for _, op in graph.walk():
        if not (isinstance(op, AllocateOp) and op.space == "global") or any(t.name == op.name for t in tensors):
            continue
        names = _names(op.offset)
        heads = "q" if op.offset is None else "kv" if "group" in names else "q" if names else "one"
        held = tuple(stored_rows(d) if i == 0 else d for i, d in enumerate(op.shape))   # the rows there are
        if any(isinstance(d, str) for d in held):
            continue   # the lowering refused it
        seq = [bool(_names(d) & set(ints)) for d in held]
        transposed = len(seq) == 2 and not seq[0] and seq[1]
        last = None
        if op.offset is not None and _names(op.offset) - {"head_idx", "group"} - set(graph.params) - set(graph.inputs):
            found = last_head(graph, op.offset)
            last = found if not isinstance(found, str) else None
        tensors.append(TensorInfo(op.name, held, heads, transposed, op.name in stored, op.name in added, last,
                                  op.rows_at is not None))
    env = _param_env(graph)
    dims = {t.name: t.dims for t in tensors}
    tiles = [1]  # the tile extents along sequence axes: the dims that coordinates step over
    per_input: dict[str, set[int]] = {}
    for _, op in graph.walk():
        if isinstance(op, CopyOp) and op.tile and len(op.tile) == 2:
            glob = op.operands[0] if op.src_space == "global" else op.operands[-1]
            for key, _ in op.coord:
                axis = 0 if key == "L" else 1
                try:
                    tile = int(eval_expr(op.tile[axis], env))
                except (ExprError, TypeError, ValueError):
                    continue
                tiles.append(tile)
                tensor_dims = dims.get(glob.base, ())
                stepped = _names(tensor_dims[axis]) & set(ints) if axis < len(tensor_dims) else set()
                for name in stepped:
                    per_input.setdefault(name, set()).add(tile)
    has_reshape = any(isinstance(op, ReshapeOp) for _, op in graph.walk())
    length_tiles = {n: tuple(sorted(per_input[n])) for n in ints if n in per_input}
    return ProgramInfo(tuple(tensors), ints, floats, max(tiles), has_reshape, length_tiles)


def _names(e: Expr | None) -> set[str]:
    return set() if e is None else free_names(e)


def _param_env(graph: Graph) -> dict[str, Any]:
    return {k: v for k, v in graph.params.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


# ------------------------------------------------------------------ inputs


def random_tensor(shape: tuple[int, ...], seed: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Normal samples pushed away from zero (|x| >= 0.1): a zero input hides missing terms."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen, dtype=torch.float64)
    x = torch.where(x >= 0, x + 0.1, x - 0.1)
    return x.to(dtype)


def make_inputs(graph: Graph, shapes: Shapes, seed: int, dtype: torch.dtype = torch.float64):
    """(tensors for the interpreter, tensors in the reference's layout, scalars).
    Outputs are NaN-poisoned, so an element the program never writes shows up; a reduce-store's target
    starts at zero, as the launch gives it."""
    info = program_info(graph)
    env = dict(_param_env(graph), **shapes.ints)
    interp, ref = {}, {}
    for i, t in enumerate(info.tensors):
        try:
            dims = [int(eval_expr(d, env)) for d in t.dims]
        except ExprError as exc:
            raise SizingError(f"cannot size global tensor '{t.name}': {exc}") from None
        canon = tuple(reversed(dims)) if t.transposed else tuple(dims)
        full = (shapes.batch, t.head_count(shapes, env), *canon)
        if t.gathered:   # one storage for the batch: as many rows as the batch's sequences together
            full = (1, full[1], shapes.batch * canon[0], *canon[1:])
        x = (torch.zeros(full, dtype=torch.float64) if t.added
             else torch.full(full, float("nan"), dtype=torch.float64) if t.output
             else random_tensor(full, seed * 1000 + i, dtype).to(torch.float64))
        ref[t.name] = x
        interp[t.name] = x.transpose(-1, -2).contiguous() if t.transposed else x
    scalars: dict[str, Any] = dict(shapes.ints)
    scalars.update(shapes.floats)
    scalars.update(random_tensor_inputs(graph, shapes, seed))   # by name, as the runtime Inputs: a reference
    return interp, ref, scalars                                   # takes them by keyword


def random_tensor_inputs(graph: Graph, shapes: Shapes, seed: int) -> dict[str, torch.Tensor]:
    """Values for the tensor Inputs (`Input seqlens : int32[batch]`): int32 elements drawn from 0 to the largest
    int Input (a length, a position or an id up to it; 0 and the largest included), fp32 elements as the float
    tensors are. A test with a meaning of its own (a document id per row) passes its own."""
    env = dict(_param_env(graph), **shapes.ints, **launch_sizes(shapes.batch, shapes.heads, shapes.kv_heads))
    top = max([v for v in shapes.ints.values()] + [1])
    out = {}
    for i, (name, t) in enumerate(graph.tensor_inputs.items()):
        try:
            dims = tensor_shape(t.dims, env)
        except ExprError as exc:
            raise SizingError(f"cannot size tensor Input '{name}': {exc}") from None
        gen = torch.Generator().manual_seed(seed * 1000 + 500 + i)
        if t.kind == "int":
            x = torch.randint(0, top + 1, dims, generator=gen, dtype=torch.int64)
            if x.numel() > 1:   # the extremes always occur
                x.view(-1)[0], x.view(-1)[-1] = 0, top
            out[name] = x.to(torch.int32)
        else:
            out[name] = random_tensor(dims, seed * 1000 + 500 + i, torch.float32)
    return out


class SizingError(ValueError):
    """A global tensor could not be sized from the shapes (reported as a failed check)."""


# ------------------------------------------------------------------ checking


@dataclass
class CheckResult:
    ok: bool
    max_error: float
    where: tuple[int, int, int] | None
    message: str = ""
    shapes: Shapes | None = None
    seed: int = 0

    def __bool__(self) -> bool:
        return self.ok

    def describe(self) -> str:
        if self.where is None:
            return self.message or f"max relative error {self.max_error:.3e}"
        b, h, r = self.where
        text = f"max relative error {self.max_error:.3e} at batch {b}, head {h}, row {r}"
        return f"{text} ({self.message})" if self.message else text


def as_graph(program: ProgramLike, defines: Mapping[str, Any] | None = None) -> Graph:
    """A Graph as is; a path (os.PathLike) or TL text parsed and lowered."""
    if isinstance(program, Graph):
        return program
    defs = {k: str(v) for k, v in (defines or {}).items()}
    ast = parse_file(program) if isinstance(program, os.PathLike) else parse_text(program)
    return lower_program(ast, defs)


def compare(got: torch.Tensor, ref: torch.Tensor, rtol: float = RTOL) -> tuple[float, tuple[int, int, int] | None]:
    """Max error relative to max(1, max|ref| over its finite elements), and its (batch, head, row); NaN counts as
    inf unless the reference has NaN there too, an infinity equal to the reference's as 0 (the log-sum-exp of a
    row without keys is -inf)."""
    if got.shape != ref.shape:
        return math.inf, None
    finite = ref[torch.isfinite(ref)]
    denom = max(1.0, float(finite.abs().max())) if finite.numel() else 1.0
    err = (got - ref).abs() / denom
    err = torch.where(torch.isnan(err), torch.full_like(err, math.inf), err)
    err = torch.where(torch.isinf(ref) & (got == ref), torch.zeros_like(err), err)
    # NaN in both: an element no one writes (a storage row no packed sequence owns)
    err = torch.where(torch.isnan(ref) & torch.isnan(got), torch.zeros_like(err), err)
    if err.numel() == 0:
        return 0.0, None
    flat = int(torch.argmax(err))
    idx = [int(i) for i in torch.unravel_index(torch.tensor(flat), err.shape)]
    return float(err.max()), (idx[0], idx[1], idx[2])


def check_interpreter(program: ProgramLike, shapes: Shapes, seed: int = 0, *, defines=None,
                      check_layouts: bool | None = None, rtol: float = RTOL,
                      reference: Reference | None = None) -> CheckResult:
    """Interpret `program` at `shapes` on seeded random inputs and compare it with `reference` (a callable,
    called as tlc.testing.oracle.call_reference says) or else the float64 reference of its `Param Variant`.
    A program without a known Variant and no `reference` fails with a message saying so: it is never read
    as attention (`check_program` checks such a program against itself as written).
    `check_layouts` defaults to on when the program has a Reshape (a program without one is legal
    before `insert-reshape`, specs/LANGUAGE.md)."""
    graph = as_graph(program, defines)
    if reference is not None:
        oracle = oracle_for(lambda: graph, reference)
    elif known_variant(graph.params) is not None:
        oracle = variant_oracle(graph.params)
    else:
        variant = graph.params.get("Variant")
        what = "no Param Variant" if variant is None else f"Param Variant = {variant}, which has no built-in reference"
        return CheckResult(False, math.inf, None, f"no reference: the program has {what} (known: "
                           f"{', '.join(KNOWN_VARIANTS)}); pass reference=, or use check_program to check the "
                           "compiled program against the program as written", shapes, seed)
    return check_against(graph, oracle, shapes, seed, check_layouts=check_layouts, rtol=rtol)


def outputs_of(graph: Graph, shapes: Shapes) -> list[Output]:
    """The tensors `graph` stores, with the (batch, heads, rows, cols) shape a reference returns ((1, heads, rows,
    cols) for one stored through a row map: its storage)."""
    info = program_info(graph)
    env = dict(_param_env(graph), **shapes.ints)
    outs = []
    for t in info.tensors:
        if t.output:
            dims = tuple(int(eval_expr(d, env)) for d in t.dims)
            rows_cols = tuple(reversed(dims)) if t.transposed else dims
            shape = (shapes.batch, t.head_count(shapes, env), *rows_cols)
            if t.gathered:   # stored through a row map: its storage, as make_inputs sizes it
                shape = (1, shape[1], shapes.batch * rows_cols[0], *rows_cols[1:])
            outs.append(Output(t.name, shape, t.transposed))
    return outs


def check_against(graph: Graph, oracle: Oracle, shapes: Shapes, seed: int = 0, *,
                  check_layouts: bool | None = None, rtol: float = RTOL) -> CheckResult:
    """Interpret `graph` at `shapes` on seeded random inputs and compare every output the oracle gives
    with the program's. Against the program as written, elements both leave unwritten (NaN) agree; against
    a reference, an unwritten element is an error. A fault of the user's reference is raised
    (ReferenceProblem), not returned: it says nothing about the program."""
    layouts = program_info(graph).has_reshape if check_layouts is None else check_layouts
    try:
        interp, ref_in, scalars = make_inputs(graph, shapes, seed)
        outputs = outputs_of(graph, shapes)
        out = run_program(graph, interp, scalars, check_layouts=layouts)
    except (InterpError, SizingError, TlcError, ValueError, KeyError, RuntimeError, IndexError, ExprError) as exc:
        return CheckResult(False, math.inf, None, f"{type(exc).__name__}: {exc}", shapes, seed)
    try:
        written_layouts = oracle.as_written is not None and program_info(oracle.as_written).has_reshape
        want = oracle.expected(outputs, interp, ref_in, scalars, check_layouts=written_layouts)
    except ReferenceProblem:
        raise
    except (InterpError, SizingError, TlcError, ValueError, KeyError, RuntimeError, IndexError) as exc:
        what = "the program as written" if oracle.as_written is not None else "the reference"
        return CheckResult(False, math.inf, None, f"{what}: {type(exc).__name__}: {exc}", shapes, seed)
    worst = CheckResult(True, 0.0, None, "", shapes, seed)
    transposed = {o.name: o.transposed for o in outputs}
    for name, ref in want.items():
        got = out[name].transpose(-1, -2) if transposed.get(name) else out[name]
        result = _compare_output(name, got, ref, oracle, rtol, len(want) > 1)
        if not result.ok or result.max_error > worst.max_error:
            worst = CheckResult(result.ok, result.max_error, result.where, result.message, shapes, seed)
        if not result.ok:
            break
    return worst


def _compare_output(name: str, got: torch.Tensor, ref: torch.Tensor, oracle: Oracle, rtol: float,
                    named: bool) -> CheckResult:
    prefix = f"output '{name}': " if named else ""
    if oracle.compares_written_elements:
        from tlc.testing.structural import output_difference

        why, _ = output_difference(got, ref)
        if why:
            return CheckResult(False, math.inf, None, prefix + why)
        both = ~torch.isnan(got) & ~torch.isnan(ref)
        got, ref = torch.where(both, got, 0.0), torch.where(both, ref, 0.0)
    err, where = compare(got, ref, rtol)
    msg = "the output holds NaN: elements never written" if math.isinf(err) and torch.isnan(got).any() else ""
    return CheckResult(err <= rtol, err, where, (prefix + msg) if msg else prefix.rstrip(": "))


def check_program(program: ProgramLike, shapes: Shapes, seed: int = 0, *, reference: Reference | None = None,
                  defines: Mapping[str, Any] | None = None, pipeline: Sequence[str] | None = None,
                  rtol: float = RTOL) -> CheckResult:
    """Check what tlc builds from `program` (the graph after the TL pass pipeline, `pipeline` or the
    default) at `shapes` against `reference` (a callable: tlc.testing.oracle.call_reference), else the
    float64 reference of its `Param Variant`, else the program as written interpreted in float64 before
    any pass — a program is checked against what its author says it means."""
    if pipeline is None:
        from tlc.passes.pipeline import DEFAULT_PIPELINE

        pipeline = DEFAULT_PIPELINE
    passes = tuple(pipeline)
    source = _Source.of(program, defines)
    oracle, built = _compiled(source, passes) if reference is None else _compile(source, passes, reference)
    return check_against(built, oracle, shapes, seed, check_layouts=True if "insert-reshape" in passes else None,
                         rtol=rtol)


@dataclass(frozen=True)
class _Source:
    """A program `check_program` can lower more than once (the oracle and the passes each need a graph of
    their own): TL text with its defines, or a Graph's canonical IR text."""

    text: str
    name: str
    defines: tuple[tuple[str, str], ...] = ()
    is_ir: bool = False

    @classmethod
    def of(cls, program: ProgramLike, defines: Mapping[str, Any] | None) -> "_Source":
        if isinstance(program, Graph):
            from tlc.ir.printer import print_graph

            return cls(print_graph(program), program.file, is_ir=True)
        defs = tuple(sorted((k, str(v)) for k, v in (defines or {}).items()))
        if isinstance(program, os.PathLike):
            return cls(Path(program).read_text(encoding="utf-8"), str(program), defs)
        return cls(program, "<input>", defs)

    def lower(self) -> Graph:
        if self.is_ir:
            from tlc.ir.irparser import parse_ir

            return parse_ir(self.text)
        return lower_program(parse_text(self.text, self.name), dict(self.defines))


@functools.lru_cache(maxsize=32)
def _compiled(source: _Source, passes: tuple[str, ...]) -> tuple[Oracle, Graph]:
    """`_compile` once per program and pipeline: a hypothesis test checks the same program many times."""
    return _compile(source, passes, None)


def _compile(source: _Source, passes: tuple[str, ...], reference: Reference | None) -> tuple[Oracle, Graph]:
    """(the oracle, the graph after `passes`)."""
    from tlc.passes.pipeline import run_pipeline

    built = source.lower()
    run_pipeline(built, list(passes))
    return oracle_for(source.lower, reference), built


__all__ = ["Shapes", "ProgramInfo", "TensorInfo", "CheckResult", "program_info", "make_inputs", "random_tensor",
           "check_interpreter", "check_against", "check_program", "outputs_of", "compare", "as_graph", "RTOL"]
