"""Pass registry: name → lazy factory, plus passes other packages register through the
`tlc.passes` entry point group (value: `module:Class`)."""
from __future__ import annotations

import importlib
from importlib import metadata
from typing import Callable

from tlc.passes.base import Pass


def _lazy(path: str) -> Callable[[], type[Pass]]:
    def load() -> type[Pass]:
        module, cls = path.split(":")
        return getattr(importlib.import_module(module), cls)

    return load


REGISTRY: dict[str, Callable[[], type[Pass]]] = {
    "verify": _lazy("tlc.passes.verify:VerifyPass"),
    "infer-shapes": _lazy("tlc.passes.infer_shapes:InferShapesPass"),
    "resolve-transpose": _lazy("tlc.passes.resolve_transpose:ResolveTransposePass"),
    "insert-reshape": _lazy("tlc.passes.insert_reshape:InsertReshapePass"),
    "online-softmax": _lazy("tlc.passes.online_softmax:OnlineSoftmaxPass"),
    "mask": _lazy("tlc.passes.mask:MaskPass"),
    "verify-final": _lazy("tlc.passes.verify_final:VerifyFinalPass"),
    "lower-tile-ops": _lazy("tlc.lowering.passes:LowerTileOpsPass"),
    "infer-layouts": _lazy("tlc.lowering.passes:InferLayoutsPass"),
    "warp-specialize": _lazy("tlc.lowering.passes:WarpSpecializePass"),
    "overlap-gemms": _lazy("tlc.lowering.passes:OverlapGemmsPass"),
    "persistent": _lazy("tlc.lowering.passes:PersistentPass"),
    "l2-sections": _lazy("tlc.lowering.passes:L2SectionsPass"),
    "prefetch-next-tile": _lazy("tlc.lowering.passes:PrefetchNextTilePass"),
    "split-masked-trips": _lazy("tlc.lowering.passes:SplitMaskedTripsPass"),
    "skip-masked-trips": _lazy("tlc.lowering.passes:SkipMaskedTripsPass"),
    "lazy-rescale": _lazy("tlc.lowering.passes:LazyRescalePass"),
    "reduction-chains": _lazy("tlc.lowering.passes:ReductionChainsPass"),
    "prefetch-tma-descriptors": _lazy("tlc.lowering.passes:PrefetchTmaPass"),
    "trace-phases": _lazy("tlc.lowering.passes:TracePhasesPass"),
    "emulate-exp2": _lazy("tlc.lowering.passes:EmulateExp2Pass"),
    "insert-sync": _lazy("tlc.lowering.passes:InsertSyncPass"),
    "pipeline": _lazy("tlc.lowering.passes:PipelinePass"),
    "prefetch-operands": _lazy("tlc.lowering.passes:PrefetchOperandsPass"),
    "defer-reductions": _lazy("tlc.lowering.passes:DeferReductionsPass"),
    "check-resources": _lazy("tlc.lowering.passes:CheckResourcesPass"),
    "fold-partitions": _lazy("tlc.lowering.passes:FoldPartitionsPass"),
}


def register(name: str, factory: Callable[[], type[Pass]]) -> None:
    REGISTRY[name] = factory


def _entry_points() -> None:
    try:
        eps = metadata.entry_points(group="tlc.passes")
    except Exception:  # pragma: no cover - broken metadata must not break tlc
        return
    for ep in eps:
        REGISTRY.setdefault(ep.name, ep.load if callable(ep.load) else _lazy(ep.value))


def lookup(name: str) -> type[Pass] | None:
    if name not in REGISTRY:
        _entry_points()
    factory = REGISTRY.get(name)
    return factory() if factory else None
