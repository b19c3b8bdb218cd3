"""`tlc precompile`: the shape-list format, its mapping to the specializations `tlc.attention`
builds, and the parallel driver (no NVRTC here; tests/nvrtc/test_compile_parallel.py runs it)."""
from __future__ import annotations

from pathlib import Path

import pytest

from tlc import runtime
from tlc.attention import precompile as pj
from tlc.attention.kernels import attention_spec
from tlc.attention.precompile import Job, attention_jobs, compile_jobs, read_shape_file
from tlc.attention.shapes import parse_shapes
from tlc.cli import main
from tlc.diagnostics import TlcError, fail

SHAPES = """\
# a model's attention calls
b=4 hq=32 hkv=8 sq=4096 sk=4096 d=128 causal dtype=bf16
b=1 hq=32 hkv=8 sq=1 sk=4096 d=128 causal     # decode: the same kernel
b=2 hq=16 sq=512 d=64 causal=false dtype=fp16
hq=16 d=192 dv=128 causal                     # MLA prefill
"""


def test_shape_lines_parse() -> None:
    shapes = parse_shapes(SHAPES, "s.txt")
    assert [line for line, _ in shapes] == [2, 3, 4, 5]
    assert shapes[0][1] == {"b": 4, "hq": 32, "hkv": 8, "sq": 4096, "sk": 4096, "d": 128, "causal": True,
                            "dtype": "bf16"}
    assert shapes[2][1]["causal"] is False and shapes[3][1]["dv"] == 128


def hopper_job(dtype: str, d: int, dv: int, causal: bool, seq_k: int | None = None) -> Job:
    """What tlc.attention builds on an H100/H200: sm_90a with its tiles, falling back to sm_90's."""
    fallback = Job.make(*attention_spec(dtype, d, dv, causal, "sm_90"), "sm_90")
    return Job.make(*attention_spec(dtype, d, dv, causal, "sm_90a", seq_k), "sm_90a", fallback=fallback)


def test_shapes_map_to_attention_specializations(monkeypatch) -> None:
    monkeypatch.delenv("TLC_ATTENTION_ARCH", raising=False)
    jobs = attention_jobs(parse_shapes(SHAPES, "s.txt"), ["sm_90a"], "s.txt")
    want = [("bf16", 128, 128, True, 4096), ("bf16", 128, 128, True, 4096), ("fp16", 64, 64, False, 512),
            ("bf16", 192, 128, True)]
    assert jobs == [hopper_job(*w) for w in want]
    assert len(set(jobs)) == 3  # batch, heads and query lengths do not choose the kernel
    short = dict(jobs[2].defines)   # 512 keys (sk defaults to sq): persistent, static tiles; its fallback is not
    assert short["Persistent"] == short["StaticTiles"] == "true" and "Persistent" not in dict(jobs[2].fallback.defines)
    assert "Persistent" not in dict(jobs[0].defines) and "Persistent" not in dict(jobs[3].defines)
    two = attention_jobs(parse_shapes("d=64\n", "s.txt"), ["sm_80", "sm_90a"], "s.txt")
    assert [j.arch for j in two] == ["sm_80", "sm_90a"] and two[0].fallback is None
    assert dict(two[1].defines)["Warps"] == "12" and dict(two[1].fallback.defines)["Warps"] == "4"


def test_a_target_means_what_it_means_to_tlc_build(monkeypatch) -> None:
    """sm_90 is the sm_80-family kernel compiled for Hopper, as `tlc build --arch sm_90` builds; before,
    a shape list's sm_90 built the sm_90a kernels."""
    monkeypatch.delenv("TLC_ATTENTION_ARCH", raising=False)
    assert attention_jobs(parse_shapes("d=64\n", "s.txt"), ["sm_90"], "s.txt") == [
        Job.make(*attention_spec("bf16", 64, 64, False, "sm_90"), "sm_90")]


def test_without_a_target_precompile_builds_what_tlc_attention_picks(monkeypatch) -> None:
    """No GPU here: the kernels tlc.attention builds on an H100 (sm_90a), or sm_90 where TLC_ATTENTION_ARCH
    keeps a Hopper GPU on the mma.sync kernels."""
    from tlc.attention.precompile import default_targets

    monkeypatch.setattr(runtime, "device_arch", lambda device=None: (_ for _ in ()).throw(fail("no GPU")))
    monkeypatch.delenv("TLC_ATTENTION_ARCH", raising=False)
    assert default_targets() == ["sm_90a"]
    monkeypatch.setenv("TLC_ATTENTION_ARCH", "sm_90")
    assert default_targets() == ["sm_90"]
    monkeypatch.setattr(runtime, "device_arch", lambda device=None: "sm_86")
    assert default_targets() == ["sm_86"]


def test_cli_precompile_sm_90_builds_the_kernels_tlc_build_sm_90_builds(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("TLC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TLC_ATTENTION_ARCH", raising=False)
    archs = []

    def fake_compile_spec(spec, *, arch, defines=None, lse=False):
        from tlc.backend_cute.compile import CompiledKernel
        archs.append(arch)
        return CompiledKernel(None, arch, "", b"", {"ptxas": {"registers": 200}}, 0.0, False), None
    monkeypatch.setattr(runtime, "compile_spec", fake_compile_spec)
    shapes = tmp_path / "shapes.txt"
    shapes.write_text("d=64\n")
    assert main(["precompile", "--shapes", str(shapes), "--arch", "sm_90", "-j", "1"]) == 0
    assert archs == ["sm_90"] and "[sm_90]: compiled in" in capsys.readouterr().out
    assert main(["precompile", "--shapes", str(shapes), "--arch", "sm_90a", "-j", "1"]) == 0
    assert archs == ["sm_90", "sm_90a"] and "[sm_90a]: compiled in" in capsys.readouterr().out


def test_a_refused_target_builds_the_fallback(monkeypatch) -> None:
    built = []

    def fake_compile_spec(spec, *, arch, defines):
        if arch == "sm_90a":
            raise fail("no wgmma here")
        built.append(arch)

        class Compiled:
            cached, metadata = False, {"ptxas": {"registers": 99}}
        return Compiled(), None
    monkeypatch.setattr(runtime, "compile_spec", fake_compile_spec)
    result = pj._compile(hopper_job("bf16", 128, 128, False))
    assert result.ok and built == ["sm_90"] and result.job.arch == "sm_90"
    assert "sm_90a refused (no wgmma here): built sm_90" in pj.report_line(result)


def test_json_shape_list() -> None:
    shapes = parse_shapes('[{"b": 4, "hq": 32, "hkv": 8, "d": 128, "causal": true}, {"d": 64}]', "s.json")
    assert [s for _, s in shapes] == [{"b": 4, "hq": 32, "hkv": 8, "d": 128, "causal": True}, {"d": 64}]
    with pytest.raises(TlcError, match="item 2: unknown key 'heads'"):
        parse_shapes('[{"d": 64}, {"heads": 2}]', "s.json")


@pytest.mark.parametrize("text,where,message", [
    ("d=128 causal\nd=64 heads=2\n", "s.txt:2:6", "unknown key 'heads'"),
    ("d=12x\n", "s.txt:1:1", "d must be a non-negative integer, got '12x'"),
    ("d=64 causal=maybe\n", "s.txt:1:6", "causal must be true or false"),
    ("d=64 d=64\n", "s.txt:1:6", "'d' given twice"),
    ("d=64 bf16\n", "s.txt:1:6", "'bf16' is not key=value"),
    ("b=2 hq=4\n", "s.txt:1:1", "the head dim d=… is required"),
    ("d=100\n", "s.txt:1:1", "head dim 100 is not supported"),
    ("d=64 hq=6 hkv=4\n", "s.txt:1:1", "6 query heads are not a multiple of 4 KV heads"),
    ("d=64 dtype=fp32\n", "s.txt:1:1", "dtype must be bf16 or fp16"),
])
def test_bad_shape_lines_point_at_the_line(text, where, message) -> None:
    with pytest.raises(TlcError) as info:
        attention_jobs(parse_shapes(text, "s.txt"), ["sm_90"], "s.txt")
    rendered = info.value.render()
    assert rendered.startswith(f"{where}: error: ") and message in rendered


def test_cli_precompile_from_shapes(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("TLC_CACHE_DIR", str(tmp_path / "cache"))
    calls = []

    def fake_compile_spec(spec, *, arch, defines=None, lse=False):
        from tlc.backend_cute.compile import CompiledKernel
        calls.append((Path(spec).name, arch, tuple(sorted(defines.items()))))
        return CompiledKernel(None, arch, "", b"", {"ptxas": {"registers": 200}}, 0.0, False), None
    monkeypatch.setattr(runtime, "compile_spec", fake_compile_spec)
    shapes = tmp_path / "shapes.txt"
    shapes.write_text(SHAPES)
    assert main(["precompile", "--shapes", str(shapes), "-j", "1"]) == 0
    out, err = capsys.readouterr()
    assert len(calls) == 3 and {c[0] for c in calls} == {"gqa_fwd.tl", "mla_prefill_fwd.tl"}
    # no --arch: a shape list warms what tlc.attention builds on this machine (sm_90a for an H100/H200,
    # also when no GPU is visible), not tlc build's sm_90 default for TL files
    from tlc.attention.precompile import default_targets
    assert {c[1] for c in calls} == set(default_targets()) == {"sm_90a"}
    assert out.count("compiled in") == 3 and "(200 registers)" in out
    assert "3 compiled, 0 already cached, 0 failed" in err


def test_cli_precompile_errors(tmp_path, capsys) -> None:
    assert main(["precompile"]) == 1
    assert "give TL files, --shapes LIST, or both" in capsys.readouterr().err
    bad = tmp_path / "bad.txt"
    bad.write_text("d=64\nd=64 nope=1\n")
    assert main(["precompile", "--shapes", str(bad)]) == 1
    err = capsys.readouterr().err
    assert f"{bad}:2:6: error: unknown key 'nope'" in err and "Traceback" not in err
    assert main(["precompile", "--shapes", str(tmp_path / "missing.txt")]) == 1
    assert "cannot read" in capsys.readouterr().err
    assert main(["precompile", "--shapes", str(bad), "-D", "BM=64"]) == 1


def test_parallel_driver_reports_every_job(tmp_path, monkeypatch) -> None:
    """Two spawned workers, each job failing fast (no such file): every result comes back, named."""
    monkeypatch.setenv("TLC_CACHE_DIR", str(tmp_path / "cache"))
    jobs = [Job.make(tmp_path / f"missing{i}.tl", {"HeadDim": 64}, "sm_90") for i in range(2)]
    seen = []
    results = compile_jobs(jobs + jobs[:1], workers=2, on_result=seen.append)
    assert len(results) == 2 and seen == results  # the duplicate was compiled once
    assert all(not r.ok and "cannot read" in r.message and str(r.job.spec) in r.message for r in results)


def test_read_shape_file(tmp_path) -> None:
    path = tmp_path / "s.txt"
    path.write_text("d=128\n")
    assert read_shape_file(str(path), ["sm_80"]) == [Job.make(*attention_spec("bf16", 128, 128, False), "sm_80")]


def test_python_api_maps_calls_to_kernels(monkeypatch) -> None:
    import tlc

    monkeypatch.setattr(pj, "cached_job", lambda job: job)  # never NVRTC here
    results = tlc.precompile([{"b": 4, "hq": 32, "hkv": 8, "d": 128, "causal": True},
                              {"d": 128, "causal": True, "sq": 1}, {"d": 64, "dtype": "fp16"}], arch="sm_80")
    assert len(results) == 2 and all(r.ok and r.cached for r in results)
    assert {r.job.arch for r in results} == {"sm_80"}


@pytest.mark.parametrize("calls,message", [
    ({"d": 128}, "a list of calls"),
    ([{"d": 128}, 7], "call 2 is a int"),
    ([{"d": 128, "heads": 2}], "call 1: unknown key 'heads'"),
    ([{"d": 100}], "head dim 100 is not supported"),
])
def test_python_api_refuses_bad_calls(calls, message) -> None:
    import tlc

    with pytest.raises(TlcError, match=message):
        tlc.precompile(calls, arch="sm_90")


def test_python_dash_m_tlc_runs_the_cli(tmp_path) -> None:
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "tlc", "check", str(Path(__file__).parents[2] / "specs" / "mha_fwd.tl")],
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr


def test_a_refused_target_counts_as_cached_through_its_fallback(monkeypatch) -> None:
    job = hopper_job("bf16", 96, 96, False)
    monkeypatch.setattr(pj, "_cached", lambda j: j.arch == "sm_90")
    monkeypatch.setattr(pj, "_refused", lambda j: j.arch == "sm_90a")   # e.g. a register budget it cannot meet
    assert pj.cached_job(job) is job.fallback  # sm_90a refuses it: its fallback is the kernel
    (result,) = pj.compile_jobs([job], 1)
    assert result.cached and "[sm_90]: already cached; sm_90a refuses it" in pj.report_line(result)
    monkeypatch.setattr(pj, "_refused", lambda j: False)  # a target that would build it is not cached
    assert pj.cached_job(job) is None
