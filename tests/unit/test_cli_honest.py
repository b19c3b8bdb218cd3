"""CLI honesty: `tlc interp`/`tlc test` check the program tlc builds (repairs listed), `tlc check -q`
is quiet, `tlc fmt -i` respects a read-only file and reports a folder it cannot write in."""
from __future__ import annotations

import os
import stat
from pathlib import Path


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
    assert main(args + ["--passes"]) == 0  # kept as a no-op alias of the default


def test_replay_of_a_repaired_program_is_not_a_failure(tmp_path) -> None:
    from tlc.testing.runner import replay

    (tmp_path / "k.tl").write_text(NO_T)
    lines: list[str] = []
    code = replay(tmp_path / "k.tl", "batch=1,heads=2,kv_heads=1,seqlen_q=5,seqlen_k=9,scale=0.3,seed=3",
                  ["HeadDim=8", "BN=8", "BM=4"], out=lines.append)
    text = "\n".join(lines)
    assert code == 0, text
    assert "before passes: max relative error" in text and "'K' needs '.T' here" in text


def test_a_wrong_built_program_is_blamed_on_the_pass_after_the_last_right_stage(monkeypatch) -> None:
    from tlc.testing import runner
    from tlc.testing.checks import CheckResult, Shapes

    from tlc.testing.oracle import Oracle

    plan = runner.Plan(ast=None, defines={}, pipeline=["a", "b", "c"], available=["a", "b", "c"],
                       oracle=Oracle("a stand-in reference"))
    monkeypatch.setattr(plan, "stage", lambda n: runner.Stage(tuple(plan.available[:n]), n))
    verdicts = {0: False, 1: True, 2: False, 3: False}  # wrong as written, repaired by a, broken by b
    monkeypatch.setattr(runner, "check_against",
                        lambda graph, oracle, shapes, seed, check_layouts=None: CheckResult(verdicts[graph], 0.0, None))
    blamed, _, log = runner.check_all_stages(plan, Shapes(), 0)
    assert blamed == "pass 'b'" and len(log) == 4
    verdicts.update({2: True, 3: True})
    assert runner.check_all_stages(plan, Shapes(), 0)[0] is None  # what tlc builds is right
    verdicts.update({1: False, 2: False, 3: False})
    assert runner.check_all_stages(plan, Shapes(), 0)[0] == "the program itself"


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


def test_fmt_in_place_refuses_a_file_it_may_not_write(tmp_path, capsys, monkeypatch) -> None:
    path = tmp_path / "a.tl"
    path.write_text(MHA)
    before = path.read_bytes()
    monkeypatch.setattr(os, "access", lambda p, mode, **k: False)  # someone else's file, in our folder
    assert main(["fmt", "-i", "--force", str(path)]) == 1
    assert f"error: {path} is read-only; not rewritten" in capsys.readouterr().err and path.read_bytes() == before


def test_fmt_in_place_through_a_symlink_rewrites_the_target(tmp_path) -> None:
    target = tmp_path / "real.tl"
    target.write_text(MHA)
    link = tmp_path / "link.tl"
    link.symlink_to(target)
    assert main(["fmt", "-i", "--force", str(link)]) == 0
    assert link.is_symlink() and "Allocate" in target.read_text()


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
    assert len(err.strip().splitlines()) == 1 and path.read_text() == MHA
    assert [p.name for p in tmp_path.iterdir()] == ["a.tl"]


def test_a_bad_schedule_define_names_its_file_once(capsys) -> None:
    """`tlc build F -D TmaStore=maybe`: one line, the file named once (it was printed twice)."""
    spec = str(Path(__file__).resolve().parents[2] / "specs" / "mha_fwd.tl")
    assert main(["build", spec, "--arch", "sm_90a", "-D", "TmaStore=maybe"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"{spec}: error: -D TmaStore=maybe: the schedule option TmaStore needs a bool (true or false); "
                   "write e.g. -D TmaStore=true"]


def test_a_diagnostic_is_prefixed_with_the_file_only_when_it_names_none() -> None:
    from tlc.diagnostics import UNKNOWN_LOC, Loc, fail

    assert fail("x", Loc("b.tl", 0, 0)).render(file="a.tl") == "b.tl: error: x"
    assert fail("x", Loc("b.tl", 3, 1)).render(file="a.tl") == "b.tl:3:1: error: x"
    assert fail("x").render(file="a.tl") == fail("x", UNKNOWN_LOC).render(file="a.tl") == "a.tl: error: x"
