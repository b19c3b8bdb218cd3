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
    assert run.stdout.rstrip().splitlines()[-3].startswith("target  built refused@line refused-no-line")


@pytest.mark.parametrize("nth", range(4))
def test_references_hold_every_tensor_the_kernel_takes(nth: int, tmp_path: Path) -> None:
    """The first four seeds whose programs the sm_90 lowering builds."""
    seed = [s for s in range(100) if _lowers(s)][nth]
    text, defines, _ = structural_program(seed)
    state, _ = lower_to_kernel_ir(text.encode(), "g.tl", "sm_90", defines or {}, name="g")
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
    """A stand-in GPU worker: seed 1 hangs, seed 2 loses its context (exits after reporting), seed 3 dies
    while running, others pass."""
    import json, sys, time
    print("noise on stdout is not protocol", flush=True)
    print("@@ " + json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        case = json.loads(line)
        print("@@ " + json.dumps({"building": [case["seed"], case["target"]]}), flush=True)
        print("@@ " + json.dumps({"start": [case["seed"], case["target"]]}), flush=True)
        if case["seed"] == 3:
            sys.exit(1)
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
    cases = [(s, "sm_90a") for s in range(6)]
    results = differential_gpu.run_all(cases, str(tmp_path), 2.0, tmp_path / "worker.log",
                                       worker=[sys.executable, str(worker)])
    assert {c[0]: r["status"] for c, r in results.items()} == {0: "ok", 1: "HANG", 2: "ERROR", 3: "ERROR", 4: "ok",
                                                                 5: "ok"}
    assert results[1, "sm_90a"]["message"] == "still running after 2 s"
    assert results[3, "sm_90a"]["message"] == "the worker died while running (exit status 1)"


def test_a_worker_that_ends_between_cases_without_finishing_one_still_moves_on(tmp_path: Path) -> None:
    ends = 'import json; print("@@ " + json.dumps({"ready": True}), flush=True)'
    results = differential_gpu.run_all([(0, "sm_90"), (1, "sm_90")], str(tmp_path), 2.0, tmp_path / "worker.log",
                                       worker=[sys.executable, "-c", ends])
    assert [r["status"] for r in results.values()] == ["ERROR", "ERROR"]


def test_a_worker_that_never_starts_fails_its_cases_in_one_line(tmp_path: Path) -> None:
    results = differential_gpu.run_all([(0, "sm_90")], str(tmp_path), 2.0, tmp_path / "worker.log",
                                       worker=[sys.executable, "-c", "import sys; sys.exit(1)"])
    assert results[0, "sm_90"]["status"] == "ERROR" and "before its first case" in results[0, "sm_90"]["message"]


@pytest.mark.parametrize("paged", [False, True])
def test_the_comparison_the_worker_makes_passes_the_sm90_kernel_ir_and_fails_a_wrong_one(tmp_path: Path, monkeypatch,
                                                                                          paged: bool) -> None:
    """compare_sizes, fed the sm_90 kernel IR on the tile evaluator in place of the GPU: the saved inputs
    and references fit the kernel, a right kernel passes, one that writes nothing or 10 % too much is WRONG;
    with `--paged`, the saved block table and lengths reach the kernel by keyword."""
    from tlc.kir.tile_eval import evaluate_program

    if paged:
        monkeypatch.setenv(differential_gpu.PAGED_ENV, "1")
    seed = next(s for s in range(100) if _lowers(s, paged))
    text, defines, _ = differential_gpu._program(seed)
    assert ("rows at block_table" in text) == paged
    state, _ = lower_to_kernel_ir(text.encode(), "g.tl", "sm_90", defines or {}, name="g")
    saved = torch.load(differential_gpu.reference_case(seed, str(tmp_path)))

    def launch(inputs, poisoned, floats, runtime):
        tensors = {a.name: inputs[a.name] for a in state.abi.tensors if not a.output}
        return evaluate_program(state.kir, state.abi, tensors, dict(floats, **runtime))["O"].to(poisoned.dtype)

    assert differential_gpu.compare_sizes(saved, launch)["status"] == "ok"
    assert differential_gpu.compare_sizes(saved, lambda i, poisoned, f, r: poisoned)["status"] == "WRONG"
    nowhere = {"sizes": [dict(size, expected=None) for size in saved["sizes"]]}
    assert differential_gpu.compare_sizes(nowhere, launch)["status"] == "unchecked"
    off = differential_gpu.compare_sizes(saved, lambda *a: launch(*a) * 1.1)
    assert off["status"] == "WRONG" and off["max_error"] > differential_gpu.RTOL


def _lowers(seed: int, paged: bool = False) -> bool:
    c = choices_of_seed(seed, paged=paged)
    text, defines = c.render(), c.defines_dict()
    if paged and not c.kv_pages:
        return False
    try:
        lower_to_kernel_ir(text.encode(), "g.tl", "sm_90", defines or {}, name="g")
    except TlcError:
        return False
    return True
