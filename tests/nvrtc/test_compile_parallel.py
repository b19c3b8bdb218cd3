"""Real NVRTC runs of the compile path's concurrency (slow: NVRTC takes ~15 s to minutes per kernel
on a 2-core machine): two processes asking for one kernel run NVRTC once, and `tlc precompile
--shapes` fills the cache in parallel so that a later call finds every kernel warm."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.nvrtc.sm90_programs import tile_gemm_sm90
from tests.unit.two_processes import race
from tlc.backend_cute import cache



def _compile_counted(cache_dir: str, counter: str, barrier, results) -> None:
    import tlc.backend_cute.compile as compile_mod

    os.environ["TLC_CACHE_DIR"] = cache_dir
    os.environ["TLC_QUIET"] = "1"
    real = compile_mod.compile_cubin

    def counted(*args, **kw):
        with open(counter, "a") as f:
            f.write(f"{os.getpid()}\n")
        return real(*args, **kw)
    compile_mod.compile_cubin = counted
    cache.clear_memory()
    barrier.wait(60)
    compiled = compile_mod.compile_kir(tile_gemm_sm90(), "sm_90a", source_name="sm90_programs.py")
    results.put((compiled.cached, compiled.cubin))


@pytest.mark.slow
def test_two_processes_one_nvrtc_run(tmp_path) -> None:
    counter = tmp_path / "runs"
    got = race(_compile_counted, str(tmp_path / "cache"), str(counter), timeout=900)
    assert len(counter.read_text().split()) == 1
    assert sorted(c for c, _ in got) == [False, True] and got[0][1] == got[1][1]
    assert got[0][1][:4] == b"\x7fELF"


@pytest.mark.slow
def test_precompile_shapes_in_parallel_then_warm(tmp_path, monkeypatch, capsys) -> None:
    from tlc.cli import main
    from tlc.attention.precompile import Job, default_targets, is_cached, read_shape_file

    monkeypatch.setenv("TLC_CACHE_DIR", str(tmp_path / "cache"))
    shapes = tmp_path / "shapes.txt"
    shapes.write_text("b=2 hq=8 hkv=2 sq=1024 sk=1024 d=64\nb=1 hq=4 sq=333 sk=77 d=32 causal\n")
    assert main(["precompile", "--shapes", str(shapes), "-j", "2"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert out.count("compiled in") == 2, out
    jobs: list[Job] = read_shape_file(str(shapes), default_targets())   # what --shapes compiles for by default
    assert all(is_cached(j) for j in jobs)
    start = time.perf_counter()
    assert main(["precompile", "--shapes", str(shapes)]) == 0
    assert capsys.readouterr().out.count("already cached") == 2 and time.perf_counter() - start < 10
    import tlc.runtime

    cache.clear_memory()
    compiled, _ = tlc.runtime.compile_spec(Path(jobs[0].spec), arch=jobs[0].arch, defines=dict(jobs[0].defines))
    assert compiled.cached and set(compiled.timings) == {"index"}
