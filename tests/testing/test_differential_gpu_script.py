"""The CPU half of bench/differential_gpu.py: building generated programs for both targets (NVRTC), the
references the GPU worker reads (they name and size every tensor the kernel takes), and the watchdog that
turns a hung case into HANG and runs the rest in a new worker (a stand-in worker here: no GPU)."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from bench import differential_gpu  # noqa: E402
from tlc.builder import lower_to_kernel_ir  # noqa: E402
from tlc.diagnostics import TlcError  # noqa: E402
from tlc.testing.structural import choices_of_seed, structural_program  # noqa: E402


@pytest.mark.slow
def test_build_only_builds_or_refuses_each_seed_at_a_line(tmp_path: Path) -> None:
    """Two seeds with small tiles: every case is built or refused at a line, at least one is built, the JSON
    holds every case and the table comes last."""
    command = [sys.executable, "bench/differential_gpu.py", "--seeds", "1,28", "--build-only", "--jobs", "2",
               "--out", str(tmp_path)]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads((tmp_path / "differential_gpu.json").read_text())
    cases = {(c["seed"], c["target"]): c for c in report["cases"]}
    assert set(cases) == {(s, t) for s in (1, 28) for t in ("sm_90", "sm_90a")}
    assert all(c["status"] in ("built", "refused") for c in cases.values()), report["summary"]
    assert all(c["line"] > 0 for c in cases.values() if c["status"] == "refused")
    assert any(c["status"] == "built" for c in cases.values())
    assert run.stdout.rstrip().splitlines()[-3].startswith("target  built refused@line")


@pytest.mark.parametrize("seed", [7, 28, 30, 31])
def test_references_hold_every_tensor_the_kernel_takes(seed: int, tmp_path: Path) -> None:
    text, defines, _ = structural_program(seed)
    try:
        state, _ = lower_to_kernel_ir(text.encode(), "g.tl", "sm_90", defines or {}, name="g")
    except TlcError:
        pytest.skip("the sm_90 lowering refuses this seed's program now")
    saved = torch.load(differential_gpu.reference_case(seed, str(tmp_path)))
    heads, kv_heads = differential_gpu.heads_of(choices_of_seed(seed).kv_offset)
    for size, (sq, sk, batch) in zip(saved["sizes"], differential_gpu.SIZES):
        rows = {"seqlen_q": sq, "seqlen_k": sk}
        for arg in state.abi.tensors:
            if arg.output:
                assert size["expected"] is None or tuple(size["expected"].shape) == (batch, heads, sq, arg.cols)
                continue
            t = size["inputs"][arg.name]
            assert t.shape[1] == (heads if arg.head == "head_idx" else kv_heads)
            assert t.dtype in (torch.bfloat16, torch.float16) and t.shape[0] == batch
            assert t.shape[2:] == (rows.get(arg.rows, int(arg.rows) if arg.rows.isdigit() else -1), arg.cols)


STAND_IN = textwrap.dedent('''
    """A stand-in GPU worker: seed 1 hangs, seed 2 loses its context (exits after reporting), others pass."""
    import json, sys, time
    print("noise on stdout is not protocol", flush=True)
    print("@@ " + json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        case = json.loads(line)
        print("@@ " + json.dumps({"start": [case["seed"], case["target"]]}), flush=True)
        if case["seed"] == 1:
            time.sleep(600)
        result = {"seed": case["seed"], "target": case["target"], "status": "ok" if case["seed"] != 2 else "ERROR"}
        print("@@ " + json.dumps({"result": result}), flush=True)
        if case["seed"] == 2:
            sys.exit(3)
''')


def test_a_hung_case_is_a_hang_and_the_rest_run_in_a_new_worker(tmp_path: Path) -> None:
    worker = tmp_path / "worker.py"
    worker.write_text(STAND_IN)
    cases = [(s, "sm_90a") for s in range(5)]
    results = differential_gpu.run_all(cases, str(tmp_path), 2.0, tmp_path / "worker.log",
                                       worker=[sys.executable, str(worker)])
    assert {c: r["status"] for c, r in results.items()} == {
        (0, "sm_90a"): "ok", (1, "sm_90a"): "HANG", (2, "sm_90a"): "ERROR", (3, "sm_90a"): "ok", (4, "sm_90a"): "ok"}


def test_a_worker_that_never_starts_fails_its_cases_in_one_line(tmp_path: Path) -> None:
    results = differential_gpu.run_all([(0, "sm_90")], str(tmp_path), 2.0, tmp_path / "worker.log",
                                       worker=[sys.executable, "-c", "import sys; sys.exit(1)"])
    assert results[0, "sm_90"]["status"] == "ERROR" and "before its first case" in results[0, "sm_90"]["message"]
