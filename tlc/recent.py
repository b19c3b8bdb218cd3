"""A bounded memo that forgets the least recently used entry: the launcher's plans and descriptors and
tlc.attention's call plans, each kept per geometry a program calls with."""
from __future__ import annotations

from collections import OrderedDict


class Recent(OrderedDict):
    """A memo of at most `most` entries that drops the least recently used (a race between threads over one
    entry is benign: the caller keeps the value it found)."""

    def __init__(self, most: int) -> None:
        super().__init__()
        self.most = most

    def recent(self, key):
        found = self.get(key)
        if found is not None:
            try:
                self.move_to_end(key)
            except KeyError:   # another thread's call dropped it meanwhile
                pass
        return found

    def keep(self, key, value):
        self[key] = value
        if len(self) > self.most:
            self.popitem(last=False)
        return value
