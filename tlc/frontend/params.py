"""What `-D NAME=VALUE` binds to a Param: the text parsed as a bool, number or word, and
checked against the kind of value the Param is declared with (used by the lowering)."""
from __future__ import annotations

import math
import re
from typing import Any

_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
BOOL = "a bool (true or false)"
POSITIVE = "a positive integer"
NUMBER = "a number"
WORD = "an identifier"

# Schedule knobs the kernel-IR passes read (tlc.lowering.passes): `-D` may set them on a program that does
# not declare them, like a launch option; the pass that reads one checks its value at the Param (or -D).
SCHEDULE_PARAMS = {"Stages": POSITIVE, "WarpSpecialize": BOOL, "TmaStore": BOOL, "Overlap": BOOL, "PingPong": BOOL,
                   "Persistent": BOOL, "SplitMasked": BOOL,
                   "LazyRescale": BOOL, "Exp2Poly": NUMBER, "PrefetchTma": BOOL, "Trace": BOOL, "TraceTrips": BOOL, "ReduceChains": NUMBER,
                   "FoldLdmatrix": BOOL, "StaticTiles": BOOL, "SkipMaskedTrips": BOOL, "L2Sections": BOOL,
                   "L2TailOnly": BOOL, "PrefetchNext": BOOL}


def parse_define(value: str) -> Any:
    low = value.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    try:
        return int(value)
    except ValueError:
        pass
    try:
        return float(value)
    except ValueError:
        return value.strip()


def value_kind(declared: Any) -> str | None:
    """What a Param declared with `declared` holds; None for an open `Param BM`."""
    if isinstance(declared, bool) or (isinstance(declared, str) and declared.lower() in ("true", "false")):
        return BOOL
    if isinstance(declared, int) and declared > 0:
        return POSITIVE  # tile sizes and head dims: 0 or -64 would divide by zero or index backwards
    if isinstance(declared, (int, float)):
        return NUMBER
    if isinstance(declared, str):
        return WORD
    return None


def fits(kind: str | None, value: Any) -> bool:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == BOOL:
        return isinstance(value, bool)
    if kind == POSITIVE:
        return number and isinstance(value, int) and value > 0
    if kind == NUMBER:
        return number and math.isfinite(value)
    if kind == WORD:
        return isinstance(value, str) and _WORD.fullmatch(value) is not None
    return True


def _parsed_as(kind: str | None, raw: str) -> Any:
    """`raw` parsed, or None when it is empty or not `kind`."""
    value = parse_define(raw) if raw.strip() else None
    return value if value is not None and fits(kind, value) else None


def bind_define(name: str, declared: Any, raw: str) -> tuple[Any, str | None]:
    """(value, None), or (None, why) when `-D name=raw` does not fit `Param name = declared`."""
    kind = value_kind(declared)
    value = _parsed_as(kind, raw)
    if value is not None:
        return value, None
    what = f"declared as {kind} (Param {name} = {declared})" if kind else "declared without a value"
    problem = f"not {raw.strip()!r}" if raw.strip() else "but it gives nothing"
    return None, (f"-D {name}={raw.strip()}: Param '{name}' is {what}, so -D {name} needs {kind or 'a value'}, "
                  f"{problem}; write e.g. -D {name}={declared if kind else '…'}")


def bind_schedule_define(name: str, raw: str) -> tuple[Any, str | None]:
    """(value, None), or (None, why) for `-D name=raw` naming a schedule knob the program does not declare."""
    kind = SCHEDULE_PARAMS[name]
    value = _parsed_as(kind, raw)
    if value is not None:
        return value, None
    example = "true" if kind == BOOL else "2"
    return None, f"-D {name}={raw.strip()}: the schedule option {name} needs {kind}; write e.g. -D {name}={example}"
