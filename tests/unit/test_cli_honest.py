"""CLI honesty: `tlc interp`/`tlc test` check the program tlc builds (repairs listed), `tlc check -q`
is quiet, `tlc fmt -i` respects a read-only file and reports a folder it cannot write in."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tlc.cli import main
from tlc.testing.runner import run_tl_test

MHA = (Path(__file__).resolve().parents[2] / "specs" / "mha_fwd.tl").read_text()
NO_T = MHA.replace("Compute GEMM Q, K.T and get S", "Compute GEMM Q, K and get S")  # the passes repair it


def test_interp_checks_the_repaired_program_and_lists_the_repair(tmp_path, capsys) -> None:
    (tmp_path / "k.tl").write_text(NO_T)
    args = ["interp", str(tmp_path / "k.tl"), "-D", "HeadDim=8", "-D", "BN=8", "-D", "BM=4", "--sizes", "5x9"]
    assert main(args) == 0
    assert "'K' needs '.T' here" in capsys.readouterr().err
    assert main(args + ["--no-passes"]) == 1  # the program as written means something else


def test_tlc_test_passes_a_program_the_passes_repair(tmp_path) -> None:
    (tmp_path / "k.tl").write_text(NO_T)
    lines: list[str] = []
    code = run_tl_test(tmp_path / "k.tl", examples=5, defines=["HeadDim=8", "BN=8", "BM=4"], out=lines.append)
    text = "\n".join(lines)
    assert code == 0, text
    assert "as written differs" in text and "'K' needs '.T' here" in text


def test_check_quiet_prints_nothing_on_success(capsys) -> None:
    spec = Path(__file__).resolve().parents[2] / "specs" / "mha_fwd.tl"
    assert main(["check", "-q", str(spec)]) == 0
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""


def test_fmt_in_place_refuses_a_read_only_file(tmp_path, capsys) -> None:
    path = tmp_path / "a.tl"
    path.write_text(MHA)
    before = path.read_bytes()
    path.chmod(0o444)
    assert main(["fmt", "-i", "--force", str(path)]) == 1
    assert "read-only" in capsys.readouterr().err and path.read_bytes() == before
    assert stat.S_IMODE(path.stat().st_mode) == 0o444


def test_fmt_in_place_keeps_the_mode(tmp_path) -> None:
    path = tmp_path / "a.tl"
    path.write_text(MHA)
    path.chmod(0o640)
    assert main(["fmt", "-i", "--force", str(path)]) == 0
    assert stat.S_IMODE(path.stat().st_mode) == 0o640 and "Allocate" in path.read_text()


def test_fmt_in_place_in_a_folder_it_cannot_write_is_one_line(tmp_path, capsys, monkeypatch) -> None:
    import tempfile

    def refuse(*a, **k):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(tempfile, "mkstemp", refuse)  # root ignores folder modes: refuse the temp file instead
    path = tmp_path / "a.tl"
    path.write_text(MHA)
    assert main(["fmt", "-i", "--force", str(path)]) == 1
    err = capsys.readouterr().err
    assert "cannot write beside" in err and "Traceback" not in err and str(path) in err
