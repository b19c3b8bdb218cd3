"""The `tlc` command line: exit codes, diagnostics on stderr, never a traceback."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tlc.cli import main

ROOT = Path(__file__).resolve().parents[2]
MHA = str(ROOT / "specs" / "mha_fwd.tl")


def test_check_ok(capsys) -> None:
    assert main(["check", "--no-passes", MHA]) == 0
    assert "ok" in capsys.readouterr().out


def test_check_reports_error_with_location(tmp_path, capsys) -> None:
    bad = tmp_path / "bad.tl"
    bad.write_text("Param BM = 64\nCompute GEMM Q K.T and get S\n")
    assert main(["check", str(bad)]) == 1
    err = capsys.readouterr().err
    assert f"{bad}:2:16: error:" in err and "^" in err and "Traceback" not in err


def test_unknown_define_is_an_error(capsys) -> None:
    assert main(["check", "--no-passes", MHA, "-D", "NoSuch=3"]) == 1
    assert "-D NoSuch" in capsys.readouterr().err


def test_bad_define_syntax(capsys) -> None:
    assert main(["check", MHA, "-D", "BM"]) == 1
    assert "write -D NAME=VALUE" in capsys.readouterr().err


def test_missing_file(capsys) -> None:
    assert main(["check", "/nonexistent/x.tl"]) == 1
    assert "cannot read" in capsys.readouterr().err


def test_interp_passes_at_odd_sizes(capsys) -> None:
    assert main(["interp", MHA, "-D", "HeadDim=16", "-D", "BM=16", "-D", "BN=8", "-D", "Causal=true",
                 "--sizes", "17x33,1x1,70x9"]) == 0
    out = capsys.readouterr().out
    assert out.count("max relative error") == 3


def test_fmt_round_trips(tmp_path, capsys) -> None:
    assert main(["fmt", MHA]) == 0
    text = capsys.readouterr().out
    again = tmp_path / "again.tl"
    again.write_text(text)
    assert main(["fmt", str(again)]) == 0
    assert capsys.readouterr().out == text


def test_fmt_in_place_keeps_comments(tmp_path, capsys) -> None:
    f = tmp_path / "c.tl"
    f.write_text("# keep me\nparam BM = 64   # and me\nAllocate O in register (BM, BM)\n")
    assert main(["fmt", "-i", str(f)]) == 0
    assert f.read_text() == "# keep me\nParam BM = 64  # and me\nAllocate O in register (BM, BM)\n"


def test_show_prints_ir(capsys) -> None:
    assert main(["show", MHA, "--no-locs"]) == 0
    out = capsys.readouterr().out
    assert out.startswith('tl.program "') and "gemm(" in out and "loop(" in out


@pytest.mark.parametrize("payload", [b"", b"\x00\x01\x02", b"\xff\xfe junk", b"Copy" * 10])
def test_console_script_never_prints_a_traceback(tmp_path, payload: bytes) -> None:
    f = tmp_path / "junk.tl"
    f.write_bytes(payload)
    proc = subprocess.run([sys.executable, "-m", "tlc.cli", "check", str(f)], capture_output=True, text=True)
    assert proc.returncode == 1
    assert "error:" in proc.stderr and "Traceback" not in proc.stderr


def test_precompile_names_the_argument_for_an_unknown_arch(capsys) -> None:
    assert main(["precompile", MHA, "--arch", "sm_75"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: --arch: unknown target 'sm_75'; tlc knows sm_80") and err.count("\n") == 1


def test_build_refuses_an_unsupported_spec_with_the_line(tmp_path, capsys) -> None:
    decode = str(ROOT / "specs" / "mla_decode_fwd.tl")
    assert main(["build", decode, "-D", "BM=64", "-o", str(tmp_path)]) == 1  # 64 rows: O alone is 256 registers
    err = capsys.readouterr().err
    assert "mla_decode_fwd.tl:" in err and "registers per thread" in err and "Traceback" not in err
    assert not list(tmp_path.iterdir())
