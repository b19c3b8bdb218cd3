"""Making a message safe for a terminal before `tlc gen` prints it.

Messages quote model replies, transcripts, requests and file names; a control byte among them
(ESC starting a sequence that clears the screen or retitles the window, a carriage return that
hides what came before) would be obeyed by the terminal. Each is shown as `\\xNN` instead.
tlc's own `tlc.diagnostics.escape_controls` is used where this tlc has it, so `tlc gen` and the
other commands print the same escapes; the fallback covers C0 (but tab and newline), DEL and C1.
"""
from __future__ import annotations

import re
from typing import Callable

# C0 except tab and newline, DEL, C1
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _escape_controls(text: str) -> str:
    """ESC becomes the four characters `\\x1b`, DEL `\\x7f`, and so on; tabs and newlines stay."""
    return _CONTROLS.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def _tlc_escape() -> Callable[[str], str]:
    try:
        from tlc.diagnostics import escape_controls as tlc_escape
    except ImportError:
        return _escape_controls
    return tlc_escape


escape_controls = _tlc_escape()
