"""`tlc build` never loses a kernel: inputs that would write the same artifacts are refused before
anything compiles (no NVRTC runs in these tests)."""
from __future__ import annotations

from pathlib import Path

from tlc.cli import main

MHA = (Path(__file__).resolve().parents[2] / "specs" / "mha_fwd.tl").read_text()


def test_two_inputs_with_one_stem_are_refused_up_front(tmp_path, capsys, monkeypatch) -> None:
    import tlc.builder
    monkeypatch.setattr(tlc.builder, "build_one", lambda *a, **k: (_ for _ in ()).throw(AssertionError("built")))
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "x.tl").write_text(MHA)
    out = tmp_path / "out"
    code = main(["build", str(tmp_path / "a" / "x.tl"), str(tmp_path / "b" / "x.tl"), "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 1 and "would both write x.{cu,cubin,json}" in err and "separate -o" in err
    assert not out.exists()


def test_a_build_does_not_claim_tens_of_seconds_up_front(tmp_path, capsys, monkeypatch) -> None:
    import tlc.builder
    monkeypatch.setattr(tlc.builder, "_build_reporting", lambda args: (args[0], f"{args[0]}: built", 0))
    (tmp_path / "x.tl").write_text(MHA)
    assert main(["build", str(tmp_path / "x.tl"), str(tmp_path / "x.tl"), "-o", str(tmp_path / "o")]) == 0
    captured = capsys.readouterr()
    assert "tens of seconds" not in captured.err and captured.out.count("built") == 1


def test_one_file_named_two_ways_is_one_build_not_a_collision(tmp_path, capsys, monkeypatch) -> None:
    import tlc.builder
    monkeypatch.setattr(tlc.builder, "_build_reporting", lambda args: (args[0], f"{args[0]}: built", 0))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.tl").write_text(MHA)
    assert main(["build", "x.tl", "./x.tl", str(tmp_path / "x.tl"), "-o", "o"]) == 0
    assert capsys.readouterr().out == "x.tl: built\n"


def test_three_inputs_with_one_stem_name_every_path(tmp_path, capsys, monkeypatch) -> None:
    import tlc.builder
    monkeypatch.setattr(tlc.builder, "_build_reporting", lambda args: (args[0], "built", 0))  # never NVRTC here
    paths = []
    for d in ("a", "b", "c"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "x.tl").write_text(MHA)
        paths.append(str(tmp_path / d / "x.tl"))
    assert main(["build", *paths, "-o", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and all(p in err for p in paths)


def test_precompile_does_not_claim_every_kernel_compiles(tmp_path, capsys, monkeypatch) -> None:
    from tlc.attention import precompile
    monkeypatch.setattr(precompile, "cached_job", lambda job: job)  # never NVRTC here
    (tmp_path / "x.tl").write_text(MHA)
    assert main(["precompile", str(tmp_path / "x.tl"), "--arch", "sm_80", "--arch", "sm_90", "-j", "1"]) == 0
    captured = capsys.readouterr()
    assert "with NVRTC into" not in captured.err and "tens of seconds" not in captured.err
    assert captured.out.count("already cached") == 2


def test_outputs_are_written_through_unpredictable_temporary_files(tmp_path) -> None:
    """A link planted at a predictable temporary name (`.<name>.<pid>.tmp`) in a shared output folder must not
    redirect the write; the output gets the permissions the umask gives a new file."""
    import os

    from tlc.builder import _atomic_write

    victim = tmp_path / "victim"
    victim.write_text("keep")
    out = tmp_path / "k.cu"
    os.symlink(victim, tmp_path / f".{out.name}.{os.getpid()}.tmp")
    mask = os.umask(0o022)
    try:
        _atomic_write(out, b"kernel")
    finally:
        os.umask(mask)
    assert victim.read_text() == "keep" and out.read_bytes() == b"kernel"
    assert out.stat().st_mode & 0o777 == 0o644
