"""`tlc fmt` keeps comments: full-line and trailing ones, `# tlc-test:` lines, comments on loop headers and
`end` lines and before them, with runs of blank lines kept as one; the text parses to the same program and
formatting it again changes nothing."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tlc.cli import main
from tlc.frontend.format import format_program
from tlc.frontend.parser import parse_text, parse_with_layout
from tlc.testing import tl_programs

ROOT = Path(__file__).resolve().parents[2]
SPECS = sorted((ROOT / "specs").glob("*.tl"))

COMMENTED = """\
# tlc-test: -D HeadDim=5 -D BM=3 -D BN=4
# A header comment.


PARAM BN = 4   # tile width
input seqlen_k : int
allocate S in register (BN, BN)
for n in 0:seqlen_k / BN:   # the KV loop
      # above a statement in the body
      compute Exp S and get new S    # trailing
      for m = 0:2
        COMPUTE GEMM S, S.T AND ACCUMULATE S
        # last in the inner body
      end  # closes m
    # after the indented loop
Compute Exp S and get new S
# the end
"""

FORMATTED = """\
# tlc-test: -D HeadDim=5 -D BM=3 -D BN=4
# A header comment.

Param BN = 4  # tile width
Input seqlen_k : int
Allocate S in register (BN, BN)
for n = 0:seqlen_k / BN  # the KV loop
  # above a statement in the body
  Compute Exp S and get new S  # trailing
  for m = 0:2
    Compute GEMM S, S.T and accumulate S
    # last in the inner body
  end  # closes m
end
# after the indented loop
Compute Exp S and get new S
# the end
"""


def _fmt(text: str) -> str:
    return format_program(*parse_with_layout(text, "c.tl"))


def _comments(text: str) -> list[str]:
    return [line[line.index("#"):].rstrip() for line in text.splitlines() if "#" in line]


def test_fmt_keeps_every_comment_where_it_was() -> None:
    """Before: every comment, `# tlc-test:` lines included, was dropped."""
    assert _fmt(COMMENTED) == FORMATTED
    assert _fmt(FORMATTED) == FORMATTED
    assert format_program(parse_text(FORMATTED, "f.tl")) == format_program(parse_text(COMMENTED, "c.tl"))


@pytest.mark.parametrize("spec", SPECS, ids=lambda p: p.name)
def test_fmt_of_a_shipped_spec_keeps_its_text_but_for_spacing(spec: Path) -> None:
    text = spec.read_text()
    formatted = _fmt(text)
    assert _comments(formatted) == _comments(text)
    assert [re.sub(r"\s+", " ", line) for line in formatted.splitlines()] == \
        [re.sub(r"\s+", " ", line) for line in text.rstrip("\n").splitlines()]


def test_fmt_in_place_keeps_comments_without_force(tmp_path, capsys) -> None:
    """Before: `tlc fmt -i` refused a file with comments unless --force, which then dropped them."""
    path = tmp_path / "c.tl"
    path.write_text(COMMENTED)
    assert main(["fmt", "-i", str(path)]) == 0
    assert path.read_text() == FORMATTED
    assert main(["fmt", "-i", "--force", str(path)]) == 0   # still accepted: it changes nothing now
    assert path.read_text() == FORMATTED
    assert main(["fmt", str(path)]) == 0 and capsys.readouterr().out == FORMATTED


def test_an_indented_loop_closed_by_end_keeps_the_comment_on_its_end() -> None:
    text = "Param BN = 4\nInput seqlen_k : int\nAllocate S in register (BN, BN)\nfor n in 0:seqlen_k:\n" \
           "  Compute Exp S and get new S\n  end  # closes n\nCompute Exp S and get new S\n"
    assert "\nend  # closes n\n" in _fmt(text)


_COMMENT_TEXT = st.text(st.characters(codec="utf-8", categories=("L", "N", "P", "Zs"), exclude_characters="\n\r"),
                        max_size=12)


@settings(max_examples=60, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(tl_programs(), st.data())
def test_generated_programs_keep_their_comments_and_meaning(text: str, data) -> None:
    """Comments and blank lines sprinkled over a generated program: all of them come back, in order, the
    statements parse as before, and fmt is idempotent."""
    lines = []
    for line in text.splitlines():
        if data.draw(st.booleans()):
            lines.append(" " * data.draw(st.integers(0, 4)) + "# " + data.draw(_COMMENT_TEXT))
        if data.draw(st.booleans()):
            lines.append("")
        lines.append(line + ("  # " + data.draw(_COMMENT_TEXT) if line.strip() and data.draw(st.booleans()) else ""))
    commented = "\n".join(lines) + "\n"
    formatted = _fmt(commented)
    assert _comments(formatted) == _comments(commented)
    assert format_program(parse_text(formatted, "f.tl")) == format_program(parse_text(text, "g.tl"))
    assert _fmt(formatted) == formatted
