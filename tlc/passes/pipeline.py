"""Pipeline strings, the default TL pipeline and the pass manager
(`--print-after`, `--print-after-all`, `--verify-each`, `--time-passes`)."""
from __future__ import annotations

import dataclasses
import re
import sys
import time
from typing import IO, Any, Callable

from tlc.diagnostics import TlcError, error, escape_controls
from tlc.numbers import INT32_MAX, parse_int
from tlc.ir.graph import Graph
from tlc.ir.printer import print_graph
from tlc.ir.verify import verify_structure
from tlc.passes.base import Pass, PassContext
from tlc.passes.registry import REGISTRY, lookup

DEFAULT_PIPELINE = [
    "verify",             # structure first: names, spaces, arity — later passes may assume them
    "infer-shapes",       # shapes, dtypes and fragment roles feed every repair below
    "resolve-transpose",  # needs shapes to decide which reading of `.T` is meant
    "insert-reshape",     # needs roles (accumulator vs A operand) and the resolved GEMM operands
    "online-softmax",     # after reshapes, so P's Reshape sits after the explicit exp2
    "mask",               # after online softmax: masks go on the scores the exp2 reads
    "verify-final",       # the paper's rules, checked on the repaired program
]

# After DEFAULT_PIPELINE, on the same graph; state accumulates on the PassContext (tlc.lowering.passes).
# lower-tile-ops, infer-layouts and check-resources need the TL graph; every other entry is a kernel-IR
# transform (tlc/kir/transforms/<name>.py, attention/ for the attention-shaped ones) that `tlc opt` runs too.
LOWERING_PIPELINE = [
    "lower-tile-ops",     # needs the repaired graph (majorness, Reshape, online softmax, masks): one rule per op
    "infer-layouts",      # needs the kernel IR's tiles and their readers: swizzles
    "warp-specialize",    # sm_90a: needs the unsynchronised copies; TMA + mbarrier ring + warp-group roles
    "insert-sync",        # needs every copy and read in program order: waits and barriers
    "pipeline",           # rewrites a loop's copies and the waits insert-sync placed into stages
    "prefetch-operands",  # after sync: each GEMM's operand loads one k-block ahead of its MMAs
    "defer-reductions",   # after the schedule is fixed: moves cross-lane sums out of the loop
    "overlap-gemms",      # sm_90a: after defer-reductions (the peeled first trip keeps per-lane sums too)
    "persistent",         # sm_90a, Param Persistent: after overlap-gemms (loops over whole tile bodies)
    "l2-sections",        # sm_90a causal, one tile per CTA: after persistent (which takes the grid itself)
    "prefetch-next-tile", # sm_90a, Param PrefetchNext: after l2-sections (prefetches by its decode of the grid)
    "prefetch-tma-descriptors",  # sm_90a, Param PrefetchTma: descriptors fetched while the mbarriers are set up
    "unroll-register-loops",  # loops of register work over global loads (a split-KV combine): trips' loads in flight together
    "check-resources",    # needs the final buffers and fragments: shared bytes and registers
    "emulate-exp2",       # Param Exp2Poly = k: every k-th score exp2 by polynomial on the FMA pipe (MUFU-bound d = 64)
    "reduction-chains",   # Param ReduceChains: row max / sum in independent partial results (shorter chains)
    "lazy-rescale",       # warp-specialised: the running max moves only past 2^8; O rescaled when a warp's row moved
    "split-masked-trips", # after check-resources (same registers, twice the loop text): trips before the first masked one run a loop without mask code
    "skip-masked-trips",  # after split-masked-trips (rewrites its masked loop): each warp group skips the trips its rows mask
    "trace-phases",       # Param Trace: timestamps at phase boundaries (bench/timeline.py), on the final schedule
    "fold-partitions",    # last: partitions of the final tiles and schedule as flat views (TLC_FOLD_PARTITIONS=0: off)
]

_ITEM = re.compile(r"\s*([a-z0-9-]+)\s*(?:\{([^}]*)\})?\s*(?:,|$)")


def _option(cls: type[Pass], key: str, raw: str) -> Any:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    if key not in fields:
        raise TlcError(error(f"pass '{cls.name}' has no option '{key}'; options: "
                             f"{', '.join(fields) or 'none'}"))
    what = f"option '{key}' of pass '{cls.name}'"
    kind = fields[key].type if isinstance(fields[key].type, str) else getattr(fields[key].type, "__name__", "")
    low = raw.strip().lower()
    if kind == "bool" or low in ("true", "false") and kind != "str":
        if low not in ("true", "false"):
            raise TlcError(error(f"{what}: '{escape_controls(raw.strip()[:24])}' is not true or false"))
        return low == "true"
    if kind == "int" or re.fullmatch(r"[+-]?[0-9]+", raw.strip(), re.ASCII) and kind != "str":
        return parse_int(raw, what, minimum=-INT32_MAX)
    return raw.strip()


def parse_entries(text: str, lookup: Callable[[str], type | None], unknown: Callable[[str], str]) -> list[Any]:
    """`"a,b{opt=value}"` → an instance of the class `lookup(name)` gives for each entry, its options as
    keyword arguments checked against the class's fields; `unknown(name)` says why a name is refused."""
    entries: list[Any] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _ITEM.match(text, pos)
        if not m or m.end() == pos:
            raise TlcError(error(f"bad pipeline string at '{text[pos:pos + 20]}'; "
                                 "write 'pass-a,pass-b{opt=value}'"))
        name, opts = m.group(1), m.group(2)
        cls = lookup(name)
        if cls is None:
            raise TlcError(error(unknown(name)))
        kwargs = {}
        for item in filter(None, (o.strip() for o in (opts or "").split(","))):
            key, _, raw = item.partition("=")
            kwargs[key.strip()] = _option(cls, key.strip(), raw)
        entries.append(cls(**kwargs))
        pos = m.end()
    return entries


def parse_pipeline(text: str) -> list[Pass]:
    """`"verify,insert-reshape{strict=true}"` → pass instances."""
    return parse_entries(text, lookup, lambda name: f"unknown pass '{name}'; known: {', '.join(sorted(REGISTRY))}")


@dataclasses.dataclass
class PassManager:
    passes: list[Pass]
    print_after: set[str] = dataclasses.field(default_factory=set)
    print_after_all: bool = False
    verify_each: bool = True
    time_passes: bool = False
    out: IO[str] = sys.stdout
    timings: list[tuple[str, float]] = dataclasses.field(default_factory=list)

    def run(self, graph: Graph, ctx: PassContext | None = None) -> PassContext:
        ctx = ctx or PassContext()
        for p in self.passes:
            t0 = time.perf_counter()
            p.apply(ctx, graph)
            self.timings.append((p.name, time.perf_counter() - t0))
            ctx.sink.raise_if_errors()
            if self.verify_each:
                problems = verify_structure(graph)
                if problems:
                    raise TlcError([error(f"after pass '{p.name}': {msg}", loc) for msg, loc in problems])
            if self.print_after_all or p.name in self.print_after:
                self.out.write(f"// -----// IR after {p.name} //----- //\n")
                show = getattr(p, "print_state", None)  # lowering passes print what they built
                self.out.write(show(ctx) if show else print_graph(graph))
        if self.time_passes:
            total = sum(t for _, t in self.timings) or 1e-9
            self.out.write("// pass timings\n")
            for name, t in self.timings:
                self.out.write(f"//   {t * 1e3:8.2f} ms  {100 * t / total:5.1f}%  {name}\n")
        return ctx


def run_pipeline(graph: Graph, pipeline: str | list[str] | None = None, **kw: Any) -> PassContext:
    text = ",".join(DEFAULT_PIPELINE) if pipeline is None else (
        pipeline if isinstance(pipeline, str) else ",".join(pipeline))
    ctx = kw.pop("ctx", None)
    return PassManager(parse_pipeline(text), **kw).run(graph, ctx)
