"""Tile evaluator: one CTA's shared memory — the buffers' values (swizzles do not change them) and
the state of every (buffer, stage): which copy wrote it, whether its cp.async group was committed,
waited for and published by a barrier, and whether an overlapping buffer has since overwritten
its bytes. Reads and writes that the real kernel would race on are faults, so the check covers
what `insert-sync` and `pipeline` decided, not only the values."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tlc.kir.tile_eval_expr import F64, TileFault, round_to

Key = tuple[str, "int | None"]   # (buffer, stage); stage None for an unstaged buffer


@dataclass
class _Write:
    kind: str                 # "async" (cp.async) or "reg" (a synchronous store from registers)
    group: int | None = None  # the commit group of an async write
    complete: bool = False    # an async write's group was waited for
    visible: bool = False     # a barrier followed the completion (or the register write)
    clobbered: str = ""       # an overlapping buffer written since: these bytes are no longer ours
    raced: str = ""           # issued while an async copy over the same bytes was in flight


def _name(key: Key) -> str:
    return key[0] if key[1] is None else f"{key[0]} stage {key[1]}"


class SharedMemory:
    def __init__(self) -> None:
        self.data: dict[str, torch.Tensor] = {}
        self.dtype: dict[str, str] = {}
        self.span: dict[Key, tuple[int, int]] = {}   # byte range of each (buffer, stage)
        self.state: dict[Key, _Write] = {}
        self.read_since_barrier: set[Key] = set()
        self.groups: list[int] = []                  # committed groups not yet waited for, oldest first
        self.next_group = 0

    def declare(self, name: str, dtype: str, shape: tuple[int, ...], offset: int) -> None:
        if name in self.data:
            raise TileFault(f"shared buffer {name} is declared twice")
        self.data[name] = torch.full(shape, float("nan"), dtype=F64)
        self.dtype[name] = dtype
        stage_bytes = shape[0] * shape[1] * (4 if dtype == "fp32" else 2)
        if len(shape) == 2:
            self.span[(name, None)] = (offset, offset + stage_bytes)
        else:  # the stage mode is outermost: stage s is one contiguous block
            for s in range(shape[2]):
                self.span[(name, s)] = (offset + s * stage_bytes, offset + (s + 1) * stage_bytes)

    def stages(self, name: str) -> int:
        t = self.data[name]
        return t.shape[2] if t.dim() == 3 else 0

    def tile(self, key: Key, transposed: bool) -> torch.Tensor:
        """A view of one stage: (rows, cols), or (cols, rows) through a transposed layout."""
        t = self.data[key[0]]
        t = t[:, :, key[1]] if key[1] is not None else t
        return t.T if transposed else t

    def _overlapping(self, key: Key) -> list[Key]:
        lo, hi = self.span[key]
        return [k for k, (a, b) in self.span.items() if a < hi and lo < b]

    # ------------------------------------------------------------------ effects
    def write(self, key: Key, transposed: bool, value: torch.Tensor, kind: str,
              keep: torch.Tensor | None = None) -> None:
        """Store `value` (rounded to the buffer's dtype); `keep` masks the elements written."""
        raced = ""
        for k in self._overlapping(key):
            if k in self.read_since_barrier:
                raise TileFault(f"writes {_name(key)} but {_name(k)} was read since the last barrier; other threads "
                                "may still be reading it (a BarrierOp must separate the read from this write)")
            rec = self.state.get(k)
            if rec is not None and rec.kind == "async" and not rec.complete:
                raced = _name(k)   # harmless unless these bytes are read: then which write landed last?
        view = self.tile(key, transposed)
        if view.shape != value.shape:
            raise TileFault(f"writes a {tuple(value.shape)} tile into {_name(key)}, which is {tuple(view.shape)}")
        value = round_to(value, self.dtype[key[0]])
        view.copy_(value if keep is None else torch.where(keep, value, view))
        for k in self._overlapping(key):
            if k != key and k in self.state:
                self.state[k].clobbered = _name(key)
        self.state[key] = _Write(kind, raced=raced)

    def read(self, key: Key, transposed: bool) -> torch.Tensor:
        rec = self.state.get(key)
        if rec is None:
            raise TileFault(f"reads {_name(key)}, which no copy has written")
        if rec.clobbered:
            raise TileFault(f"reads {_name(key)}, but a write to {rec.clobbered} has since overwritten its bytes")
        if rec.raced:
            raise TileFault(f"reads {_name(key)}, whose last write was issued while an async copy into {rec.raced} "
                            "was still in flight (no WaitOp in between): either may have landed last")
        if rec.kind == "async":
            if rec.group is None:
                raise TileFault(f"reads {_name(key)}, whose async copy was never committed (CommitOp)")
            if not rec.complete:
                raise TileFault(f"reads {_name(key)} while its async copy (commit group {rec.group}) is in flight: "
                                "no WaitOp has completed that group")
            if not rec.visible:
                raise TileFault(f"reads {_name(key)} with no BarrierOp after the WaitOp that completed its copy "
                                "(other threads' copies may not have landed)")
        elif not rec.visible:
            raise TileFault(f"reads {_name(key)}, written from registers, with no BarrierOp in between")
        self.read_since_barrier.add(key)
        return self.tile(key, transposed).clone()

    def commit(self) -> None:
        for rec in self.state.values():
            if rec.kind == "async" and rec.group is None:
                rec.group = self.next_group
        self.groups.append(self.next_group)
        self.next_group += 1

    def wait(self, pending: int) -> None:
        """cp.async.wait_group: every committed group but the newest `pending` has landed."""
        done = set(self.groups[:max(0, len(self.groups) - pending)])
        self.groups = [g for g in self.groups if g not in done]
        for rec in self.state.values():
            if rec.group in done:
                rec.complete = True

    def barrier(self) -> None:
        for rec in self.state.values():
            if rec.kind == "reg" or rec.complete:
                rec.visible = True
        self.read_since_barrier.clear()
