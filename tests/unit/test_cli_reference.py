"""`tlc interp` and `tlc test` arguments: what a program is compared with (--reference, its Variant, or the
program as written — never attention by default) and `tlc test --max-len`."""
from __future__ import annotations

from pathlib import Path

import pytest

from tlc.cli import main

ROOT = Path(__file__).resolve().parents[2]
WINDOW = str(ROOT / "tests" / "testing" / "long" / "sliding_window.tl")
SMALL = ["-D", "HeadDim=3", "-D", "BM=2", "-D", "BN=3"]

REFS = '''
import torch
from tlc.reference import attention_reference


def causal(Q, K, V, scale):
    return attention_reference(Q, K, V, scale=scale, causal=True)


def boom(Q, K, V):
    raise KeyError("V")
'''


@pytest.fixture
def refs(tmp_path, monkeypatch) -> str:
    (tmp_path / "tlc_cli_refs.py").write_text(REFS)
    monkeypatch.chdir(tmp_path)
    return "tlc_cli_refs"


def test_interp_checks_a_program_without_variant_against_itself_as_written(capsys) -> None:
    """It was compared with attention: a sliding window read as causal attention showed an error of 1.1."""
    assert main(["interp", WINDOW, *SMALL]) == 0
    out = capsys.readouterr().out
    assert f"{WINDOW}: checked against: the program as written (no Variant)" in out


def test_interp_no_passes_without_variant_says_it_compares_the_program_with_itself(capsys) -> None:
    assert main(["interp", WINDOW, *SMALL, "--no-passes"]) == 0
    assert "with --no-passes the program as written is compared with itself" in capsys.readouterr().err


def test_interp_with_your_reference(refs, capsys) -> None:
    assert main(["interp", WINDOW, *SMALL, "--sizes", "7x9"]) == 0   # the window has not moved yet
    assert main(["interp", WINDOW, *SMALL, "--reference", f"{refs}:causal"]) == 1  # it has at 17x33
    captured = capsys.readouterr()
    assert f"checked against: your reference {refs}:causal" in captured.out
    assert "max relative error" in captured.err and "exceeds 1e-06" in captured.err


@pytest.mark.parametrize("spec, message", [
    ("nomodulecolon", "error: --reference 'nomodulecolon': no ':'; write MODULE:FUNCTION"),
    ("{m}:boom", "error: --reference {m}:boom raised KeyError: 'V'"),
    ("{m}:missing", "error: --reference '{m}:missing': module {m} has no 'missing'; it defines boom, causal"),
])
def test_interp_bad_reference_is_one_line(refs, capsys, spec, message) -> None:
    assert main(["interp", WINDOW, *SMALL, "--reference", spec.format(m=refs)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(message.format(m=refs)) and "Traceback" not in "\n".join(err)


def test_test_reference_argument(refs, capsys) -> None:
    assert main(["test", WINDOW, *SMALL, "--examples", "10", "--reference", f"{refs}:causal", "--max-len", "9"]) == 0
    assert f"ok: 10 examples (lengths 1 to 9), checked against: your reference {refs}:causal" in capsys.readouterr().out
    assert main(["test", WINDOW, *SMALL, "--examples", "5", "--reference", "m:"]) == 1
    out = capsys.readouterr().out
    assert out.strip() == f"{WINDOW}: error: --reference 'm:': no function after ':'; write MODULE:FUNCTION, e.g. " \
        "--reference myrefs:window_attention (myrefs.py in the current directory or on sys.path)"


@pytest.mark.parametrize("value, message", [("0", "0 is out of range; it must be from 1 to 4096"),
                                            ("x", "'x' is not a whole number"),
                                            ("5000", "5000 is out of range; it must be from 1 to 4096")])
def test_test_max_len_is_a_length(capsys, value, message) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["test", WINDOW, "--max-len", value])
    assert exit_.value.code == 2
    assert f"argument --max-len: {message}" in capsys.readouterr().err
