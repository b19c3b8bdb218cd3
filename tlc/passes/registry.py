"""Pass registry: name → lazy factory, plus passes other packages register through the
`tlc.passes` entry point group (value: `module:Class`). The TL passes and the lowering driver's are
listed here; every kernel-IR transform (tlc.kir.transforms.registry, found from its module) joins as
the lowering pass that runs it (tlc.lowering.passes.transform_pass)."""
from __future__ import annotations

import importlib
from importlib import metadata
from typing import Callable

from tlc.kir.transforms.registry import TRANSFORMS
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
    "check-resources": _lazy("tlc.lowering.check_resources:CheckResourcesPass"),
}


def _transform(name: str) -> Callable[[], type[Pass]]:
    def load() -> type[Pass]:
        from tlc.kir.transforms.registry import lookup as transform
        from tlc.lowering.passes import transform_pass

        return transform_pass(transform(name))  # type: ignore[arg-type]

    return load


REGISTRY.update({name: _transform(name) for name in TRANSFORMS})


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
