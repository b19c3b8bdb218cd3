"""What `-D NAME=VALUE` binds to a Param: the text parsed as a bool, number or word, and
checked against the kind of value the Param is declared with (used by the lowering)."""
from __future__ import annotations

import math
import re
from typing import Any, Sequence

from tlc.diagnostics import TlcError, fail
from tlc.kir.transforms.schedule import SCHEDULE_KNOBS
from tlc.numbers import problem as number_problem
from tlc.numbers import read_number, shown

_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
BOOL = "a bool (true or false)"
POSITIVE = "a positive integer"
NUMBER = "a number"
WORD = "an identifier"

# Schedule knobs the kernel-IR transforms read (tlc.kir.transforms.schedule, which declares each once): `-D`
# may set them on a program that does not declare them, like a launch option; the lowering checks each value
# at its Param (or -D) once, when it parses the schedule.
SCHEDULE_PARAMS = {name: {"bool": BOOL, "positive": POSITIVE, "number": NUMBER}[knob.define]
                   for name, knob in SCHEDULE_KNOBS.items()}


def define_items(items: Sequence[str] | None) -> dict[str, str]:
    """`-D NAME=VALUE` words → {NAME: VALUE}. A word without `=` or a name, and one name bound to two
    different values (which of them would win is a guess), are one-line errors naming them."""
    out: dict[str, str] = {}
    for item in items or []:
        name, eq, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not eq or not name:
            raise fail(f"-D {shown(item)}: write -D NAME=VALUE")
        if name in out and out[name] != value:
            raise fail(f"-D {shown(name)}={shown(out[name])} and -D {shown(name)}={shown(value)} both bind "
                       f"{shown(name)}; give it once")
        out[name] = value
    return out


def parse_define(value: str, what: str = "the value") -> Any:
    """`-D` text as a value: true or false, a number in ASCII (an integer within 32 bits, a finite
    float: tlc.numbers), else the word itself. A number out of range raises TlcError."""
    low = value.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    number = read_number(value, what)
    return value.strip() if number is None else number


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


def _parsed_as(name: str, kind: str | None, raw: str) -> tuple[Any, str | None]:
    """(`raw` parsed, None); (None, None) when it is empty or not `kind`; (None, why) for a number out of range."""
    try:
        value = parse_define(raw, f"-D {name}") if raw.strip() else None
    except TlcError as exc:
        return None, number_problem(exc)
    return (value if value is not None and fits(kind, value) else None), None


def bind_define(name: str, declared: Any, raw: str) -> tuple[Any, str | None]:
    """(value, None), or (None, why) when `-D name=raw` does not fit `Param name = declared`."""
    kind = value_kind(declared)
    value, out_of_range = _parsed_as(name, kind, raw)
    if value is not None:
        return value, None
    if out_of_range:
        return None, out_of_range
    what = f"declared as {kind} (Param {name} = {declared})" if kind else "declared without a value"
    problem = f"not '{shown(raw.strip())}'" if raw.strip() else "but it gives nothing"
    return None, (f"-D {name}={shown(raw.strip())}: Param '{name}' is {what}, so -D {name} needs "
                  f"{kind or 'a value'}, {problem}; write e.g. -D {name}={declared if kind else '…'}")


def bind_schedule_define(name: str, raw: str) -> tuple[Any, str | None]:
    """(value, None), or (None, why) for `-D name=raw` naming a schedule knob the program does not declare."""
    kind = SCHEDULE_PARAMS[name]
    value, out_of_range = _parsed_as(name, kind, raw)
    if value is not None:
        return value, None
    if out_of_range:
        return None, out_of_range
    example = "true" if kind == BOOL else "2"
    return None, (f"-D {name}={shown(raw.strip())}: the schedule option {name} needs {kind}; "
                  f"write e.g. -D {name}={example}")
