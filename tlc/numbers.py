"""Numbers from users — `-D` values, shape lists, `--sizes`, option values, TL literals — read one way.

Only ASCII forms count (Python's `int` also reads `²`, `٣` and `1_000`), every integer has a stated
range (the kernels compute in 32-bit), a float must be finite, and a refusal is one `TlcError` line that
names the argument and shows the text cut short, never Python's own words about digit limits.
"""
from __future__ import annotations

import argparse
import math
import re
from typing import Callable

from tlc.diagnostics import TlcError, escape_controls, fail

INT32_MAX = 2**31 - 1
_INT = re.compile(r"[+-]?[0-9]+", re.ASCII)
_FLOAT = re.compile(r"[+-]?(?:[0-9]+\.[0-9]*|\.[0-9]+|[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)
_SHOWN = 24  # characters of a user's text quoted back in a message


def shown(text: str, limit: int = _SHOWN) -> str:
    """`text` as a message quotes it: control characters escaped, a text longer than `limit` cut to its
    start and length."""
    if len(text) > limit:
        text = f"{text[:max(limit - 8, 8)]}… ({len(text)} characters)"
    return escape_controls(text)


def _digits(text: str) -> int:
    return len(text.lstrip("+-").lstrip("0"))


def a_kind(value: object) -> str:
    """`value`'s type in words for a message: 'an int', 'a NoneType'."""
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def _lead(what: str) -> str:
    return f"{what}: " if what else ""


def check_int(value: int, what: str, *, minimum: int = 0, maximum: int = INT32_MAX) -> int:
    """`value` (an int, not a bool) if `minimum <= value <= maximum`, else a one-line TlcError naming `what`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise fail(f"{_lead(what)}a whole number is needed, not {a_kind(value)}")
    if value < minimum or value > maximum:
        size = f"an integer of {value.bit_length()} bits" if value.bit_length() > 64 else str(value)
        raise fail(f"{_lead(what)}{size} is out of range; it must be from {minimum} to {maximum}")
    return value


def parse_int(text: str, what: str, *, minimum: int = 0, maximum: int = INT32_MAX) -> int:
    """A whole number written in ASCII digits (an optional sign), from `minimum` to `maximum`; `what`
    names the argument in the message ('' when the caller names it, as argparse does)."""
    body = text.strip()
    if not _INT.fullmatch(body):
        raise fail(f"{_lead(what)}'{shown(body)}' is not a whole number; write ASCII digits such as 128")
    if _digits(body) > len(str(max(abs(minimum), abs(maximum)))):
        raise fail(f"{_lead(what)}'{shown(body)}' has {_digits(body)} digits; it must be from {minimum} to {maximum}")
    return check_int(int(body), what, minimum=minimum, maximum=maximum)


def parse_float(text: str, what: str, *, minimum: float | None = None, maximum: float | None = None) -> float:
    """A finite number written in ASCII (`0.5`, `1e-6`, `3`), within the bounds given."""
    body = text.strip()
    if not _FLOAT.fullmatch(body):
        raise fail(f"{_lead(what)}'{shown(body)}' is not a number; write one such as 0.5 or 1e-6")
    value = float(body)
    if not math.isfinite(value):
        raise fail(f"{_lead(what)}'{shown(body)}' is past a float's range; write a smaller number")
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        bounds = " and ".join(b for b in (f"at least {minimum:g}" if minimum is not None else "",
                                          f"at most {maximum:g}" if maximum is not None else "") if b)
        raise fail(f"{_lead(what)}{shown(body)} is out of range; it must be {bounds}")
    return value


def read_number(text: str, what: str, *, maximum: int = INT32_MAX) -> int | float | None:
    """The int or float `text` spells in ASCII, or None when it is not written as a number (a word).
    An integer past ±`maximum`, or a float past float's range, is a TlcError naming `what`."""
    body = text.strip()
    if _INT.fullmatch(body):
        return parse_int(body, what, minimum=-maximum, maximum=maximum)
    if _FLOAT.fullmatch(body):
        return parse_float(body, what)
    return None


def _option(parse: Callable[..., int | float], **bounds) -> Callable[[str], int | float]:
    """An argparse `type=` reading with `parse` (argparse prints the message, after the option's name)."""
    def read(text: str):
        try:
            return parse(text, "", **bounds)
        except TlcError as exc:
            raise argparse.ArgumentTypeError(problem(exc)) from None

    return read


def int_option(*, minimum: int = 0, maximum: int = INT32_MAX) -> Callable[[str], int]:
    """An argparse `type=` for a whole-number option, read by `parse_int`."""
    return _option(parse_int, minimum=minimum, maximum=maximum)  # type: ignore[return-value]


def float_option(*, minimum: float | None = None, maximum: float | None = None) -> Callable[[str], float]:
    """An argparse `type=` for a number option, read by `parse_float`."""
    return _option(parse_float, minimum=minimum, maximum=maximum)  # type: ignore[return-value]


def problem(error: TlcError) -> str:
    """The one message of a TlcError these helpers raise (for callers that put it in their own words)."""
    return error.diagnostics[0].message


__all__ = ["INT32_MAX", "a_kind", "check_int", "float_option", "int_option", "parse_float", "parse_int", "problem",
           "read_number", "shown"]
