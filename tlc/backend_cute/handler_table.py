"""Emitter mixins' handler tables: a mixin (`Sm90Emitter`, `ViewEmitter`) fills a `HandlerTable` with
`@table.handles(OpClass)` and inherits `table.mixin_base()`; the class that defines the
singledispatchmethod `emit` (`CuteEmitter`) gets every inherited table's handlers registered on it."""
from __future__ import annotations

import functools
from typing import Callable

from tlc.kir.base import Op


class HandlerTable:
    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.handlers: dict[type[Op], Callable] = {}

    def handles(self, cls: type[Op]) -> Callable[[Callable], Callable]:
        def register(fn: Callable) -> Callable:
            self.handlers[cls] = fn
            return fn
        return register

    def mixin_base(self) -> type:
        """A base class whose subclasses register this table on their own `emit` dispatcher."""
        table = self

        class Registers:
            def __init_subclass__(cls, **kwargs) -> None:
                super().__init_subclass__(**kwargs)
                if cls.__name__ == table.owner:
                    return                          # the mixin itself: handlers are added below it
                dispatcher = cls.__dict__.get("emit")
                if not isinstance(dispatcher, functools.singledispatchmethod):
                    raise TypeError(f"{cls.__name__} inherits {table.owner} but defines no singledispatchmethod "
                                    "`emit`")
                for op_cls, handler in table.handlers.items():
                    dispatcher.register(op_cls, handler)

        Registers.__name__ = Registers.__qualname__ = f"{self.owner}Registers"
        return Registers
