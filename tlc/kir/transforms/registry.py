"""The kernel-IR transforms by pass name, found from their modules: `overlap-gemms` is the Transform
class of the module overlap_gemms.py in this package or in attention/, loaded when first asked for.

Adding a transform is adding its module (and its FileCheck test, tests/filecheck/kir/); the lowering
pipeline's order is tlc.passes.pipeline.LOWERING_PIPELINE.
"""
from __future__ import annotations

import importlib
import pkgutil
from functools import cache
from typing import Callable

from tlc.kir.transforms.base import Transform

PACKAGES = ("tlc.kir.transforms", "tlc.kir.transforms.attention")
FRAMEWORK = frozenset({"base", "schedule", "registry", "opt"})   # this package's modules that are no transform


def pass_name(module: str) -> str:
    """A transform module's pass name: its last component, kebab-case."""
    return module.rsplit(".", 1)[-1].replace("_", "-")


def _modules() -> dict[str, str]:
    """Pass name → module path, from the packages' files (nothing imported but the packages)."""
    found: dict[str, str] = {}
    for package in PACKAGES:
        for info in pkgutil.iter_modules(importlib.import_module(package).__path__):
            if not info.ispkg and info.name not in FRAMEWORK:
                found[pass_name(info.name)] = f"{package}.{info.name}"
    return found


def transform_class(module: str) -> type[Transform]:
    """The one Transform class `module` defines whose `name` is the module's pass name."""
    mod = importlib.import_module(module)
    name = pass_name(module)
    classes = [c for c in vars(mod).values() if isinstance(c, type) and issubclass(c, Transform)
               and c.__module__ == mod.__name__ and c.name == name]
    if len(classes) != 1:
        raise TypeError(f"{module} defines {len(classes)} Transform classes named '{name}'; it must define one")
    return classes[0]


def _loader(module: str) -> Callable[[], type[Transform]]:
    return cache(lambda: transform_class(module))


TRANSFORMS: dict[str, Callable[[], type[Transform]]] = {name: _loader(module) for name, module in _modules().items()}


def lookup(name: str) -> type[Transform] | None:
    factory = TRANSFORMS.get(name)
    return factory() if factory else None
