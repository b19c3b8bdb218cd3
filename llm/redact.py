"""Removing the API key from what is shown or recorded (messages, transcripts, eval.json): raw,
JSON-escaped, decoded. What is parsed or built (reply bodies, answers, programs) is never redacted.

An endpoint may echo the key back, and a JSON body may spell any of its characters as an
escape (`\\u0073`, `\\u004B`, `\\/`, a surrogate pair), at any escaping depth (`\\\\u0073` in a
JSON string inside a JSON string). One pattern per key matches every such spelling.
A key shorter than `MIN_SECRET_CHARS` is not redacted: cutting `1` or `BN` out of a transcript
destroys it (every `"index": 1`, every `Param BN`), and such a key is no secret worth the name.
"""
from __future__ import annotations

import functools
import json
import re
from typing import Any, TypeGuard

REDACTED = "[REDACTED]"
MIN_SECRET_CHARS = 8  # shorter keys (`1`, `EMPTY`, `ollama`) are placeholders, not secrets

# JSON's two-character escapes: the character, then the letter that follows the backslash
_SHORT_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "\b": "b", "\f": "f", "\n": "n", "\r": "r", "\t": "t"}


def _hex4(code: int) -> str:
    """`0x4b` → `004[bB]`: JSON allows either case in `\\uXXXX`."""
    return "".join(f"[{d}{d.upper()}]" if d.isalpha() else d for d in f"{code:04x}")


def _unicode_escape(char: str) -> str:
    code = ord(char)
    if code <= 0xFFFF:
        return "u" + _hex4(code)
    high = 0xD800 + ((code - 0x10000) >> 10)
    low = 0xDC00 + ((code - 0x10000) & 0x3FF)
    return f"u{_hex4(high)}\\\\+u{_hex4(low)}"


def _char_pattern(char: str) -> str:
    """One character of the key: literal, or escaped behind one or more backslashes.

    Leading backslashes are part of the match, so the replacement never leaves a dangling
    `\\` that would turn `[REDACTED]` into an invalid escape."""
    escapes = [_unicode_escape(char)]
    if char in _SHORT_ESCAPES:
        escapes.append(re.escape(_SHORT_ESCAPES[char]))
    return rf"(?:\\*{re.escape(char)}|\\+(?:{'|'.join(escapes)}))"


@functools.lru_cache(maxsize=8)
def _key_pattern(secret: str) -> re.Pattern[str]:
    return re.compile("".join(_char_pattern(c) for c in secret))


def is_secret(key: str | None) -> TypeGuard[str]:
    """Whether `key` is long enough to be redacted (see the module docstring)."""
    return key is not None and len(key) >= MIN_SECRET_CHARS


def redact(text: str, secret: str | None) -> str:
    """Replace every spelling of `secret` in `text` (raw or JSON-escaped); a no-op without a secret
    or with one shorter than `MIN_SECRET_CHARS`."""
    if not is_secret(secret) or not text:
        return text
    if secret in text or "\\" in text:
        return _key_pattern(secret).sub(REDACTED, text)
    return text


def leaks(text: str, secret: str | None) -> bool:
    return is_secret(secret) and _key_pattern(secret).search(text) is not None


def _decoded_strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (*_decoded_strings(k), *_decoded_strings(v))]
    if isinstance(value, list):
        return [s for item in value for s in _decoded_strings(item)]
    return []


def redact_values(value: Any, secret: str | None) -> Any:
    """Decoded JSON with the key removed from every string, keys of objects included."""
    if isinstance(value, str):
        return redact(value, secret)
    if isinstance(value, dict):
        return {redact(k, secret): redact_values(v, secret) for k, v in value.items()}
    if isinstance(value, list):
        return [redact_values(item, secret) for item in value]
    return value


def redact_body(text: str, secret: str | None) -> str:
    """A reply body: scrubbed as raw text, then checked again after JSON decoding.

    The raw pass covers every JSON spelling, so the decoded check is a second line of defence;
    if it ever finds the key, the body is re-encoded from the scrubbed values."""
    text = redact(text, secret)
    if not is_secret(secret):
        return text
    try:
        data = json.loads(text)
        if not any(leaks(s, secret) for s in _decoded_strings(data)):
            return text
        return json.dumps(redact_values(data, secret), ensure_ascii=False)
    except (ValueError, RecursionError):  # not JSON, or nested deeper than Python follows
        return text
