"""Shape lists: the calls `tlc precompile --shapes FILE` and `tlc.precompile(calls)` take, parsed and checked
(tlc.attention.precompile maps each to the specializations `tlc.attention` builds,
tlc.attention.kernels.attention_spec). A shape list has one call per line: `key=value` words and the bare word `causal`; `#` starts a comment:

    b=4 hq=32 hkv=8 sq=4096 sk=4096 d=128 causal dtype=bf16
    hq=16 d=192 dv=128 causal            # MLA prefill

`d` is required; `dv` defaults to `d`, `dtype` to bf16 (or fp16), `causal` to false (`causal=true`
works too), `hkv` to `hq`, `sk` to `sq`. `b`, `hq`, `hkv` are checked as tlc.attention checks them but
do not choose the kernel; dtype, d, dv, causal and the key length do (`sk`: short sequences take a
persistent kernel on Hopper, tlc.attention.tuning.short_keys; a line without `sk` or `sq` gets the
long-sequence one). A file whose first character is `[` is JSON: a list of objects with the same keys
(`"causal": true`).
"""
from __future__ import annotations

import json
from typing import Any, Mapping

from tlc.diagnostics import GLOBAL_SOURCES, Loc, TlcError, fail
from tlc.numbers import INT32_MAX, a_kind, check_int, parse_int, problem, shown

_INT_KEYS = ("b", "hq", "hkv", "sq", "sk", "d", "dv")
_KEYS = (*_INT_KEYS, "dtype", "causal")


def _shape_error(path: str, line: int, col: int, message: str) -> TlcError:
    return fail(f"{message}; a line reads like `b=4 hq=32 hkv=8 sq=4096 sk=4096 d=128 causal dtype=bf16`",
                Loc(path, line, col))


def _parse_word(word: str, path: str, line: int, col: int, shape: dict[str, Any]) -> None:
    key, eq, value = word.partition("=")
    if not eq:
        value = "true" if key == "causal" else ""
        if key != "causal":
            raise _shape_error(path, line, col, f"'{shown(word)}' is not key=value")
    if key not in _KEYS:
        raise _shape_error(path, line, col, f"unknown key '{shown(key)}' (keys: {', '.join(_KEYS)})")
    if key in shape:
        raise _shape_error(path, line, col, f"'{key}' given twice")
    if key in _INT_KEYS:
        if not (value.isascii() and value.isdigit()):
            raise _shape_error(path, line, col, f"{key} must be a non-negative integer, got '{shown(value)}'")
        try:
            shape[key] = parse_int(value, key, minimum=0, maximum=INT32_MAX)
        except TlcError as exc:
            raise _shape_error(path, line, col, problem(exc)) from None
    elif key == "causal":
        if value.lower() not in ("true", "false", "1", "0"):
            raise _shape_error(path, line, col, f"causal must be true or false, got '{shown(value)}'")
        shape[key] = value.lower() in ("true", "1")
    else:
        shape[key] = value


def parse_shapes(text: str, path: str = "<shapes>") -> list[tuple[int, dict[str, Any]]]:
    """(line number, shape) for each call in a shape list (text or JSON); TlcError with the line."""
    GLOBAL_SOURCES.add(path, text)
    if text.lstrip().startswith("["):
        return _parse_json_shapes(text, path)
    shapes = []
    for number, raw in enumerate(text.splitlines(), 1):
        body = raw.split("#", 1)[0]
        shape: dict[str, Any] = {}
        col = 1
        for word in body.split():
            col = body.index(word, col - 1) + 1
            _parse_word(word, path, number, col, shape)
            col += len(word)
        if shape:
            shapes.append((number, shape))
    return shapes


def _parse_json_shapes(text: str, path: str) -> list[tuple[int, dict[str, Any]]]:
    try:
        # Integers stay text until checked (tlc.numbers): Python refuses to read one of thousands of digits.
        items = json.loads(text, parse_int=lambda digits: digits if len(digits) > 20 else int(digits))
    except json.JSONDecodeError as exc:
        raise fail(f"not valid JSON: {exc.msg}", Loc(path, exc.lineno, exc.colno)) from None
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise fail("a JSON shape list is a list of objects such as {\"d\": 128, \"causal\": true}", Loc(path, 1, 1))
    return [(0, shape_of(item, f"item {n}", path)) for n, item in enumerate(items, 1)]  # errors name the file only


def shape_of(item: Mapping[str, Any], what: str, path: str) -> dict[str, Any]:
    """One call given as a mapping (a JSON object, a tlc.precompile dict), checked as a shape line is."""
    shape: dict[str, Any] = {}
    for key, value in item.items():
        if not isinstance(key, str):
            raise fail(f"{what}: a key is {a_kind(key)}; keys are strings such as 'd' or 'causal'",
                       Loc(path, 0, 0))
        if isinstance(value, int) and not isinstance(value, bool):
            try:
                check_int(value, f"{what}: {shown(key)}", minimum=-INT32_MAX, maximum=INT32_MAX)
            except TlcError as exc:  # before str(): Python refuses to print an int of thousands of digits
                raise fail(problem(exc), Loc(path, 0, 0)) from None
        value = str(value).lower() if isinstance(value, bool) else value
        try:
            _parse_word(f"{key}={value}", path, 0, 0, shape)
        except TlcError as exc:
            raise fail(f"{what}: {exc.diagnostics[0].message}", Loc(path, 0, 0)) from None
    return shape
