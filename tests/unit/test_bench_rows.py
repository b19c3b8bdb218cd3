"""bench_attention.py --bar: its rows are issue 12's bar table, every row's kernel lowers (and emits) for
sm_90 and sm_90a without NVRTC, and bench/precompile.py's `--set bar` job list holds every one of them."""
from __future__ import annotations

import pytest

from bench.bench_attention import BAR_ROWS, SHORT_ROWS, _build_key, row_build, row_tiles

ARCHES = ("sm_90", "sm_90a")


def _rows() -> dict[str, dict]:
    return {r["name"]: r for r in BAR_ROWS}


def test_bar_rows_are_the_issue_table() -> None:
    rows = _rows()
    assert len(rows) == len(BAR_ROWS)  # names are unique: the table and the fp16 ratio look rows up by name
    want = {  # name: (B, H, Hkv, S, d, d_v, causal, dtype)
        "MHA d=64": (4, 32, 32, 4096, 64, 64, False, "bf16"),
        "MHA d=64 causal": (4, 32, 32, 4096, 64, 64, True, "bf16"),
        "MHA d=128": (4, 16, 16, 4096, 128, 128, False, "bf16"),
        "MHA d=128 causal": (4, 16, 16, 4096, 128, 128, True, "bf16"),
        "MHA d=256": (4, 8, 8, 4096, 256, 256, False, "bf16"),
        "MHA d=256 causal": (4, 8, 8, 4096, 256, 256, True, "bf16"),
        "GQA 32/8 d=128": (4, 32, 8, 4096, 128, 128, False, "bf16"),
        "GQA 32/8 d=128 causal": (4, 32, 8, 4096, 128, 128, True, "bf16"),
        "MQA 32/1 d=128": (4, 32, 1, 4096, 128, 128, False, "bf16"),
        "MQA 32/1 d=128 causal": (4, 32, 1, 4096, 128, 128, True, "bf16"),
        "MLA prefill causal": (4, 16, 16, 4096, 192, 128, True, "bf16"),
        "MHA d=128 fp16": (4, 16, 16, 4096, 128, 128, False, "fp16"),
        "MHA d=128 fp16 causal": (4, 16, 16, 4096, 128, 128, True, "fp16"),
        "MHA d=128 S=1k": (16, 16, 16, 1024, 128, 128, False, "bf16"),
        "MHA d=128 S=1k causal": (16, 16, 16, 1024, 128, 128, True, "bf16"),
        "MHA d=128 S=16k": (1, 16, 16, 16384, 128, 128, False, "bf16"),
        "MHA d=128 S=16k causal": (1, 16, 16, 16384, 128, 128, True, "bf16"),
    }
    got = {n: (r["B"], r["H"], r.get("Hkv", r["H"]), r["S"], r["d"], r.get("d_v", r["d"]), r["causal"],
               r.get("dtype", "bf16")) for n, r in rows.items()}
    assert got == want
    assert all(r["B"] * r["S"] == 16 * 1024 for r in BAR_ROWS)  # B·S = 16k tokens everywhere
    for r in BAR_ROWS:  # each fp16 row names its bf16 twin, which differs only in dtype
        if r.get("dtype") == "fp16":
            twin = rows[r["bf16_row"]]
            assert {k: v for k, v in r.items() if k not in ("name", "dtype", "bf16_row")} == \
                {k: v for k, v in twin.items() if k != "name"}


def _kernels(arch: str, rows: list[dict] = BAR_ROWS) -> dict[tuple, tuple]:
    """The distinct (spec, -D bindings) the --bar rows build on `arch` (GQA, MQA and the S = 16k rows share
    the d=128 MHA kernel: the group and the lengths are runtime inputs; on sm_90a the S = 1k rows take
    the short-sequence schedule, tlc.attention.tuning.short_keys)."""
    return {_build_key(*row_build(r, row_tiles(r, arch), arch)): row_build(r, row_tiles(r, arch), arch)
            for r in rows}


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("rows,count", [(BAR_ROWS, {"sm_90": 9, "sm_90a": 11}), (SHORT_ROWS, {"sm_90": 7, "sm_90a": 8})],
                         ids=("bar", "short"))
def test_every_bar_kernel_lowers_and_emits(arch, rows, count) -> None:
    from tlc.backend_cute.emit import emit_program
    from tlc.builder import lower_to_kernel_ir
    from tlc.names import kernel_name
    from tlc.runtime import normal_defines

    kernels = _kernels(arch, rows)
    assert len(kernels) == count[arch]  # bar: d=64/128/256 x causal, MLA prefill, fp16 d=128 x causal (+ S=1k x causal)
    for spec, defines in kernels.values():
        state, _ = lower_to_kernel_ir(spec.read_bytes(), str(spec), arch, normal_defines(defines),
                                      name=kernel_name(spec))
        state.kir.verify()
        source = emit_program(state.kir, source=spec.name, cu_name=f"{spec.stem}.cu")
        assert ("wgmma" in source) == (arch == "sm_90a"), (spec.name, defines)  # sm_90a: no silent mma.sync


@pytest.mark.parametrize("arch", ARCHES)
def test_each_row_builds_what_tlc_attention_builds_for_its_call(arch, monkeypatch) -> None:
    """With the default tiles a row is tlc.attention's kernel for its shape, schedule knobs included (a tuned
    Stages, as d = 64 causal's 3 on sm_90a, is not replaced by the tile table's); a swept variant with the
    same values binds its own Stages."""
    from bench import bench_attention
    from tlc.attention.kernels import attention_spec

    monkeypatch.setattr(bench_attention, "EXTRA_DEFINES", {})   # TLC_BENCH_DEFINES is not what this is about

    for r in (*BAR_ROWS, *SHORT_ROWS):
        d, dv = r["d"], r.get("d_v", r["d"])
        assert row_build(r, row_tiles(r, arch), arch) == attention_spec(r.get("dtype", "bf16"), d, dv, r["causal"],
                                                                        arch, r["S"]), r["name"]
    row = _rows()["MHA d=64 causal"]
    assert row_build(row, row_tiles(row, arch), arch)[1]["Stages"] == (3 if arch == "sm_90a" else 2)
    assert row_build(row, dict(row_tiles(row, arch)), arch)[1]["Stages"] == 2   # a sweep entry equal to the table


@pytest.mark.parametrize("arch", ARCHES)
def test_precompile_covers_the_bar_rows(arch) -> None:
    from bench.precompile import job_set

    for name in ("bar", "all"):
        jobs = job_set(name, arch)
        have = {(_build_key(*j[:2]), j[3] if len(j) > 3 else arch) for j in jobs}
        missing = [k for k in _kernels(arch) if (k, arch) not in have]
        assert not missing, f"--set {name} --arch {arch} lacks {missing}"
    assert len(job_set("bar", arch)) == {"sm_90": 9, "sm_90a": 11}[arch]
    have = {(_build_key(*j[:2]), j[3]) for j in job_set("short", arch)}
    assert have == {(k, arch) for k in _kernels(arch, SHORT_ROWS)}


def test_check_slice_reads_the_kv_head_of_each_query_head() -> None:
    """The check (tlc's and each baseline's) compares query heads 0 and H-1 against the KV head each
    reads, so an output computed with the wrong group mapping fails."""
    import torch

    from bench.bench_attention import check_slice
    from tlc.testing_tolerance import attention_reference

    torch.manual_seed(0)
    q = torch.randn(1, 8, 40, 32, dtype=torch.bfloat16)
    k, v = (torch.randn(1, 2, 40, 32, dtype=torch.bfloat16) for _ in range(2))
    good = attention_reference(q, k, v, causal=True).to(q.dtype)  # head h reads KV head h // 4
    assert check_slice(good, q, k, v, True).passed
    wrong = attention_reference(q, k[:, [1, 0]], v[:, [1, 0]], causal=True).to(q.dtype)
    assert not check_slice(wrong, q, k, v, True).passed
    expanded = k.repeat_interleave(4, dim=1), v.repeat_interleave(4, dim=1)  # the baselines' fallback
    assert check_slice(good, q, *expanded, True).passed


def test_notes_name_how_each_baseline_ran_and_the_fp16_ratio() -> None:
    from bench.bench_attention import add_notes

    rows = [dict(name="MHA d=128", tlc_tflops=400.0, flash_mode="mha", cudnn_mode="mha"),
            dict(name="MHA d=128 fp16", bf16_row="MHA d=128", tlc_tflops=390.0, cudnn_errors={"mha": "no kernel"}),
            dict(name="GQA 32/8 d=128", tlc_tflops=1.0, flash_mode="enable_gqa", cudnn_mode="repeat_interleave",
                 cudnn_errors={"enable_gqa": "No available kernel. Aborting execution."}),
            dict(name="MQA 32/1 d=128", error="boom", check_passed=False)]
    add_notes(rows)
    assert rows[0]["notes"] == []
    assert rows[1]["notes"] == ["cuDNN n/a: mha: no kernel", "tlc fp16/bf16 0.975 (within 3%)"]
    assert abs(rows[1]["fp16_over_bf16"] - 0.975) < 1e-9
    assert rows[2]["notes"][0] == "FA2: SDPA enable_gqa=True"
    assert rows[2]["notes"][1].startswith("cuDNN: K/V heads expanded with repeat_interleave (outside the timing); "
                                          "enable_gqa refused: No available kernel")
    assert rows[3]["notes"] == ["tlc: boom"]


def test_a_row_whose_host_time_nears_its_kernels_is_flagged() -> None:
    from bench.bench_attention import HOST_BOUND, add_notes

    assert 120.0 < HOST_BOUND * 174 < 140.0

    rows = [dict(name="a", tlc_ms=0.174, tlc_host_us=140.0), dict(name="b", tlc_ms=0.174, tlc_host_us=120.0),
            dict(name="c", tlc_ms=0.174)]
    add_notes(rows)
    assert rows[0]["notes"] == ["tlc host 140 us a call against its 174 us kernel: may be host-bound"]
    assert rows[1]["notes"] == [] == rows[2]["notes"]


def test_precompile_rows_and_variants_select_and_multiply_the_jobs() -> None:
    from bench.precompile import job_set

    jobs = job_set("bar", "sm_90a", "S=16k", ["Trace=true", "Persistent=true;Stages=3"])
    plain = [j for j in jobs if "Trace" not in j[1] and "Persistent" not in j[1]]
    assert len(plain) == 2 and {j[1]["Causal"] for j in plain} == {False, True}
    assert len(jobs) == 6 and all(j[1]["Stages"] == "3" for j in jobs if "Persistent" in j[1])
    with pytest.raises(SystemExit, match="--rows selects bar rows"):
        job_set("tests", "sm_90a", "S=16k")
    with pytest.raises(SystemExit, match="NAME=VALUE"):
        job_set("bar", "sm_90a", None, ["Trace"])


def test_compile_time_binds_its_defines_in_every_kernel(monkeypatch) -> None:
    from bench import compile_time

    monkeypatch.setenv(compile_time._DEFINES_ENV, "SplitMasked=false;ReduceChains=2")
    for spec, defines in compile_time.kernels().values():
        assert defines["SplitMasked"] == "false" and defines["ReduceChains"] == "2"


def test_a_row_that_stalls_ends_the_benchmark_naming_it(tmp_path) -> None:
    """bench.watchdog: past TLC_BENCH_TIMEOUT seconds the process ends (status 3) with one line naming the
    row, what it printed before kept; a row that finishes in time changes nothing."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    code = ("import time\nfrom bench import watchdog\nwith watchdog('fast'):\n    pass\nprint('done fast')\n"
            "with watchdog('MHA d=64 causal'):\n    time.sleep(30)\nprint('never')\n")
    env = {**os.environ, "TLC_BENCH_TIMEOUT": "1", "PYTHONPATH": str(root)}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=25, env=env)
    assert run.returncode == 3 and run.stdout == "done fast\n", (run.returncode, run.stdout)
    assert "MHA d=64 causal: still running after 1 s (a kernel that hangs?)" in run.stderr
    bad = subprocess.run([sys.executable, "-c", "from bench import watchdog\nwatchdog('x')"], capture_output=True,
                         text=True, timeout=25, env={**env, "TLC_BENCH_TIMEOUT": "soon"})
    assert bad.returncode == 1 and bad.stderr.strip().splitlines() == [
        "TLC_BENCH_TIMEOUT='soon': write seconds, e.g. 240 (0: no limit)"]
