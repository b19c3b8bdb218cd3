"""`Schedule`: every knob the kernel-IR transforms (and lower-tile-ops' warp plan) read, typed, and parsed and
checked once from a program's Params (or `tlc opt --schedule`); a transform reads `schedule.stages`, never
the TL graph.

A knob is a field whose metadata is its `Knob`: the Param that sets it, what `-D NAME=` takes for it
where the program declares no such Param (tlc.frontend.params reads the table from here), and the
check with its advice. A value the check refuses is an error at the Param's line, `Param NAME = value:
advice`; a knob that only refines another (`needs`) is refused when set without it. Fields are in the
lowering pipeline's order, so the errors come in the order the transforms would meet them.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Mapping

from tlc.diagnostics import Diagnostic, Loc, TlcError, error

# How `Stages` is refused: by the TMA ring where the target's copies may become one (warp-specialize),
# else by the cp.async pipeline (which `pipeline` also says of 3 or 4 stages a declined ring leaves it).
TMA_STAGES = "the TMA ring takes 1 to 4 stages"
CP_ASYNC_STAGES = "the cp.async pipeline runs 1 or 2 stages (the sm_90a TMA ring takes up to 4)"
BOOL_ADVICE = "use true or false"


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_bool(v: Any) -> bool:
    return isinstance(v, bool)


@dataclass(frozen=True)
class Knob:
    """One schedule knob: `Param <param> = value`."""

    param: str
    define: str                        # what `-D` takes without a Param: "bool", "positive" or "number"
    ok: Callable[[Any], bool] = _is_bool
    advice: str = BOOL_ADVICE
    needs: str | None = None           # the field this knob refines: set without it, it would change nothing
    why: str = ""                      # what it refines, for that refusal


def knob(default: Any, param: str, define: str = "bool", **kw: Any) -> Any:
    """A `Schedule` field set by `Param <param>`."""
    return field(default=default, metadata={"knob": Knob(param, define, **kw)})


@dataclass(frozen=True)
class Schedule:
    """The schedule knobs, each with the value it has when no Param sets it."""

    # lower-tile-ops' warp plan (tlc/lowering/warps.py), before any transform: None lets the target choose (4 on
    # the sm_80 family, one warp group per 64 rows of BM on sm_90a), so a program that leaves it unset builds
    # for both; a set value the target cannot take is refused there, at its Param
    warps: int | None = knob(None, "Warps", "positive", ok=lambda v: _is_int(v) and v > 0,
                             advice="use a positive number of warps")
    # warp-specialize (sm_90a): TMA loads, an mbarrier ring and warp-group roles; TmaStore: the epilogue by TMA
    warp_specialize: bool = knob(True, "WarpSpecialize")
    tma_store: bool = knob(False, "TmaStore")
    # warp-specialize's ring or pipeline's cp.async stages (checked in from_params: the limit is the target's)
    stages: int = knob(2, "Stages", "positive", ok=_is_int)
    # overlap-gemms: the next first GEMM over this trip's softmax; PingPong: consumer groups take turns
    overlap: bool = knob(True, "Overlap")
    pingpong: bool = knob(True, "PingPong")
    # persistent: a CTA per resident slot over the tiles; StaticTiles: blockIdx.x + k·gridDim.x
    persistent: bool = knob(False, "Persistent")
    static_tiles: bool = knob(False, "StaticTiles", needs="persistent",
                              why="it picks how a persistent kernel's CTAs take their tiles")
    # l2-sections: the grid in L2-sized sections of heads; L2TailOnly: only the last section's
    l2_sections: bool = knob(False, "L2Sections")
    l2_tail_only: bool = knob(False, "L2TailOnly", needs="l2_sections",
                              why="it picks which heads l2-sections reorders")
    prefetch_next: bool = knob(False, "PrefetchNext")      # prefetch-next-tile
    prefetch_tma: bool = knob(False, "PrefetchTma")        # prefetch-tma-descriptors
    # emulate-exp2: every k-th score exp2 by polynomial (0: none)
    exp2_poly: int = knob(0, "Exp2Poly", "number", ok=lambda v: _is_int(v) and 0 <= v <= 64,
                          advice="use 0 (off) or k from 1 to 64: every k-th exp2 by polynomial")
    # reduction-chains: row max and sum in this many independent partial results
    reduce_chains: int = knob(1, "ReduceChains", "number", ok=lambda v: not _is_bool(v) and v in (1, 2, 4, 8),
                              advice="use 1, 2, 4 or 8")
    # lazy-rescale and split-masked-trips: None lets the kernel decide (on where warp-specialised)
    lazy_rescale: bool | None = knob(None, "LazyRescale", ok=lambda v: v is None or _is_bool(v))
    split_masked: bool | None = knob(None, "SplitMasked", ok=lambda v: v is None or _is_bool(v))
    skip_masked_trips: bool = knob(False, "SkipMaskedTrips")
    # trace-phases: timestamps at phase boundaries; TraceTrips: also the first trips of each loop
    trace: bool = knob(False, "Trace")
    trace_trips: bool = knob(False, "TraceTrips")
    fold_ldmatrix: bool = knob(True, "FoldLdmatrix")       # fold-partitions: ldmatrix sources folded too
    # where each knob was set (its Param line, or the file for -D): where a transform's refusal points
    locs: Mapping[str, Loc | None] = field(default_factory=dict, compare=False, repr=False)

    def loc(self, param: str) -> Loc | None:
        """Where `Param <param>` was set, if it was."""
        return self.locs.get(param)

    @classmethod
    def from_params(cls, params: Mapping[str, Any], locs: Mapping[str, Loc | None] | None = None, *,
                    tma_ring: bool = False) -> Schedule:
        """The knobs `params` set (by Param name), each checked; every refusal at its Param's line, all
        raised together. `tma_ring`: the target's copies may become a TMA ring, which takes up to 4
        stages where the cp.async pipeline takes 2 (and says so in the refusal)."""
        locs = dict(locs or {})
        values: dict[str, Any] = {}
        refused: set[str] = set()
        problems: list[Diagnostic] = []
        for f, k in knob_fields():
            if k.param not in params:
                continue
            value = params[k.param]
            ok, advice = k.ok, k.advice
            if f.name == "stages":
                ring = tma_ring and values.get("warp_specialize", True)
                most, advice = (4, TMA_STAGES) if ring else (2, CP_ASYNC_STAGES)
                ok = lambda v: _is_int(v) and 1 <= v <= most  # noqa: E731
            if not ok(value):
                refused.add(f.name)
                problems.append(error(f"Param {k.param} = {value!r}: {advice}", locs.get(k.param)))
                continue
            values[f.name] = int(value) if f.type == "int" else value   # ReduceChains = 2.0 is 2 chains
            if k.needs and value is True and not values.get(k.needs, False) and k.needs not in refused:
                needed = SCHEDULE_FIELDS[k.needs].param
                problems.append(error(f"{k.param} = true needs {needed} = true ({k.why}); set both, or drop "
                                      f"{k.param}", locs.get(k.param)))
        if problems:
            raise TlcError(problems)
        return cls(**values, locs=locs)


def knob_fields() -> list[tuple[dataclasses.Field, Knob]]:
    """The schedule's fields with their knobs, in pipeline order."""
    return [(f, f.metadata["knob"]) for f in fields(Schedule) if "knob" in f.metadata]


SCHEDULE_FIELDS: dict[str, Knob] = {f.name: k for f, k in knob_fields()}   # field name → knob
SCHEDULE_KNOBS: dict[str, Knob] = {k.param: k for k in SCHEDULE_FIELDS.values()}  # Param name → knob
