"""The sequence lengths `tlc test` draws: 1, a tile ± 1 at one, two, four and eight tiles of the tiles that
step over each length, and any length up to --max-len — so a program whose behaviour starts past two tiles
(a loop start that moves with block_idx) is tested there, not passed on the short lengths alone."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import find, settings
from hypothesis.errors import NoSuchExample

from tlc.cli import main
from tlc.testing import attention_shapes, default_max_len, edge_lengths
from tlc.testing.runner import replay, run_tl_test

ROOT = Path(__file__).resolve().parents[2]
MHA = ROOT / "specs" / "mha_fwd.tl"
WINDOW_BUG = ROOT / "tests" / "testing" / "long" / "window_start.tl"
SMALL = {"HeadDim": 3, "BM": 2, "BN": 3}
FIND = settings(database=None, max_examples=500)


def test_edges_are_a_tile_plus_minus_one_at_one_two_four_and_eight_tiles() -> None:
    assert edge_lengths((4,), 40) == [1, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 40]
    assert edge_lengths((2, 3), 13)[-3:] == [11, 12, 13]  # cut at the longest, which is drawn itself


def test_default_longest_is_eight_tiles_of_the_largest_tile_and_one() -> None:
    assert default_max_len(MHA, SMALL) == 25 and default_max_len(MHA) == 8 * 128 + 1


@pytest.mark.parametrize("name, tile", [("seqlen_q", 2), ("seqlen_k", 3)])
def test_each_length_reaches_past_two_tiles_of_its_own_tile(name: str, tile: int) -> None:
    """Lengths stopped at two tiles and one more (of the largest tile, 7 here): a window two tiles
    behind the diagonal never moved."""
    strategy = attention_shapes(MHA, defines=SMALL)
    for length in (1, tile - 1 or 1, tile + 1, 4 * tile + 1, 8 * tile + 1, 25):
        assert find(strategy, lambda s: s.ints[name] == length, settings=FIND).ints[name] == length


def test_max_len_bounds_every_length_and_is_drawn_itself() -> None:
    strategy = attention_shapes(MHA, defines=SMALL, max_len=40)
    assert find(strategy, lambda s: s.ints["seqlen_k"] == 40, settings=FIND)
    with pytest.raises(NoSuchExample):
        find(attention_shapes(MHA, defines=SMALL, max_len=12), lambda s: max(s.ints.values()) > 12, settings=FIND)


def test_shrinking_goes_toward_short_lengths() -> None:
    minimal = find(attention_shapes(MHA, defines=SMALL), lambda s: s.ints["seqlen_q"] >= 10, settings=FIND)
    assert minimal.ints == {"seqlen_q": minimal.ints["seqlen_q"], "seqlen_k": 1} and minimal.ints["seqlen_q"] <= 15


def test_a_loop_start_bug_past_two_tiles_is_caught() -> None:
    """`for n = max(0, block_idx * BM / BN - 2):…` claims attention but skips keys from seqlen_q = 11 on
    (BM = 2, BN = 3): past two tiles and one more, where the drawn lengths used to stop ('ok: 30 examples'
    while `tlc interp` showed an error of 1.1)."""
    lines: list[str] = []
    defines = [f"{k}={v}" for k, v in SMALL.items()]
    code = run_tl_test(WINDOW_BUG, examples=30, seed=0, defines=defines, out=lines.append)
    out = "\n".join(lines)
    assert code == 1 and "broken by the program itself" in out, out
    assert "checked against: the attention reference (Variant = attention)" in out
    shrunk = re.search(r"counterexample \(shrunk\): (.*) seqlen_q=(\d+) seqlen_k=(\d+)", out)
    assert shrunk and 11 <= int(shrunk.group(2)) <= 17, out
    command = re.search(r"--replay (\S+)", out)
    assert replay(WINDOW_BUG, command.group(1), defines, out=lines.append) == 1


def test_max_len_on_the_command_line(capsys) -> None:
    args = ["test", str(WINDOW_BUG), "-D", "HeadDim=3", "-D", "BM=2", "-D", "BN=3", "--examples", "30"]
    assert main(args + ["--max-len", "10"]) == 0  # the window never moves below 11: honest, and said
    assert "ok: 30 examples (lengths 1 to 10)" in capsys.readouterr().out
    assert main(args + ["--max-len", "12"]) == 1
