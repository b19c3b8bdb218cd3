"""An indented line writer that counts output lines (for `#line` resets)."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator


class Writer:
    def __init__(self, indent: str = "  ") -> None:
        self._lines: list[str] = []
        self._depth = 0
        self._indent = indent

    def line(self, text: str = "") -> None:
        for part in text.split("\n"):
            self._lines.append(f"{self._indent * self._depth}{part}" if part else "")

    def raw(self, text: str) -> None:
        """Lines without indentation (preprocessor directives, boilerplate blocks)."""
        self._lines.extend(text.rstrip("\n").split("\n"))

    @property
    def next_line(self) -> int:
        return len(self._lines) + 1

    @contextmanager
    def indented(self) -> Iterator[None]:
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1

    @contextmanager
    def block(self, head: str, tail: str = "}") -> Iterator[None]:
        self.line(f"{head} {{" if head else "{")
        with self.indented():
            yield
        self.line(tail)

    def text(self) -> str:
        return "\n".join(self._lines) + "\n"
