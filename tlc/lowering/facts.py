"""What the TL graph proves for the kernel-IR transforms, computed once by the lowering driver
(`lower-tile-ops`) and handed to each transform as its `Facts`: the target, lazy-rescale's stale-max
precondition (tlc.lowering.stale_max) and skip-masked-trips' masked-trip one (tlc.passes.masked_trips)."""
from __future__ import annotations

from tlc.arch import ArchInfo
from tlc.ir.graph import Graph
from tlc.ir.ops import LoopOp, MaskOp
from tlc.kir.transforms.base import Facts
from tlc.lowering.stale_max import stale_max_blocker
from tlc.passes.masked_trips import masked_trip_changes


WINDOW_KINDS = ("causal", "predicate")   # the masks whose fully masked trips skip-masked-trips may skip


def window_masked_trips(graph: Graph) -> str | None:
    """Why skipping a trip a causal or predicate mask hides entirely would change what a loop carries (the first
    such loop's reason), or None when no loop's fully masked trip changes anything."""
    for _, op in graph.walk():
        masked = isinstance(op, LoopOp) and op.body is not None and any(
            isinstance(m, MaskOp) and m.kind in WINDOW_KINDS for m in op.body.ops())
        why = masked_trip_changes(op, lambda m: m.kind in WINDOW_KINDS) if masked else None
        if why:
            return why
    return None


def tl_facts(graph: Graph, arch: ArchInfo) -> Facts:
    return Facts(arch=arch, stale_max=stale_max_blocker(graph), masked_trips=window_masked_trips(graph))
