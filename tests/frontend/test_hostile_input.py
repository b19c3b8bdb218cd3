"""Inputs that are not TL at all, or are TL at absurd sizes: always a `file:line:col: error:`
diagnostic (or success), never a traceback — through the API and through `tlc check`."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tlc.diagnostics import TlcError
from tlc.frontend.lower import lower_program
from tlc.frontend.parser import parse_text

LOCATED = re.compile(r"^\S+:\d+:\d+: error: ", re.MULTILINE)


def deep_loops(n: int, indented: bool) -> str:
    lines = ["Param BM = 4", "Allocate S in register (BM, BM)"]
    for i in range(n):
        lines.append(f"{' ' * i}for i{i} in 0:2:" if indented else f"for i{i} = 0:2")
    lines.append(f"{' ' * n}Compute Exp S and get new S")
    if not indented:
        lines += ["end"] * n
    return "\n".join(lines) + "\n"


HOSTILE = {
    "empty": b"",
    "blank": b"\n\n   \n\t\n",
    "comments-only": b"# just a comment\n",
    "binary-junk": bytes(range(1, 256)) * 4,
    "elf-header": b"\x7fELF\x02\x01\x01\x00\x00\x00",
    "nul-bytes": b"Param BM = 4\nAll\x00ocate S\n",
    "non-utf8": b"Param BM = 4\nParam X = \xff\xfe\n",
    "latin1": "Param caf\u00e9 = 1\n".encode("latin-1"),
    "ten-megabytes": b"Param BM = 4\n" * 800_000,
    "one-long-line": b"Param BM = " + b"1" * 200_000 + b"\n",
    "deep-for-end": deep_loops(1000, indented=False).encode(),
    "deep-indented": deep_loops(1000, indented=True).encode(),
    "unbalanced-parens": b"Allocate S in register " + b"(" * 5000 + b"\n",
    "crlf": b"Param BM = 4\r\nAllocate S in register (BM, BM)\r\n",
}


def _check(data: bytes, name: str) -> str | None:
    """The rendered diagnostics, or None if the input is accepted."""
    try:
        lower_program(parse_text(data, f"{name}.tl"))
    except TlcError as exc:
        return exc.render()
    return None


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_api_reports_located_diagnostic_or_accepts(name: str) -> None:
    rendered = _check(HOSTILE[name], name)
    if name == "crlf":
        assert rendered is None
        return
    assert rendered is not None, f"{name} was accepted"
    assert LOCATED.search(rendered), rendered[:400]


def test_deep_nesting_is_a_diagnostic_not_recursion() -> None:
    rendered = _check(HOSTILE["deep-for-end"], "deep")
    assert rendered is not None and "nest" in rendered


def test_moderate_nesting_is_fine() -> None:
    assert _check(deep_loops(8, indented=False).encode(), "ok") is None
    assert _check(deep_loops(8, indented=True).encode(), "ok") is None


def test_non_utf8_points_at_the_byte() -> None:
    assert "non-utf8.tl:2:11: error: byte 0xff is not valid UTF-8" in _check(HOSTILE["non-utf8"], "non-utf8")


def test_nul_points_at_the_byte() -> None:
    assert "nul.tl:2:4: error: NUL byte" in _check(HOSTILE["nul-bytes"], "nul")


def _cli_available() -> bool:
    try:
        import tlc.cli  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.skipif(not _cli_available(), reason="tlc/cli.py not written yet")
@pytest.mark.parametrize("name", ["empty", "binary-junk", "nul-bytes", "non-utf8", "ten-megabytes", "deep-for-end",
                                  "deep-indented"])
def test_cli_check_exits_1_without_traceback(name: str, tmp_path) -> None:
    path = tmp_path / f"{name}.tl"
    path.write_bytes(HOSTILE[name])
    env = dict(os.environ, PYTHONPATH=os.getcwd(), TLC_DEBUG="")
    proc = subprocess.run([sys.executable, "-m", "tlc.cli", "check", str(path)], capture_output=True, text=True,
                          env=env, timeout=60)
    both = proc.stdout + proc.stderr
    assert proc.returncode == 1, both[-2000:]
    assert "Traceback" not in both and "RecursionError" not in both, both[-2000:]
    assert LOCATED.search(both), both[-2000:]
