"""`tlc gen` through the real `tlc` command and its `tlc.commands` entry point, in a subprocess."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata

import pytest
from conftest import SECRET
from loopback import fenced
from scripts import SPECS, request_for, sketch_of, spec_text

pytest.importorskip("tlc.api")
pytestmark = pytest.mark.skipif(
    not any(ep.name == "gen" for ep in metadata.entry_points(group="tlc.commands")),
    reason="tlc is not installed with its entry points (pip install -e .)",
)


def tlc(*argv: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tlc.cli", *argv], capture_output=True, text=True, env=env,
                          timeout=timeout)


def test_tlc_gen_then_tlc_check(endpoint_env, tmp_path):
    program = spec_text("gqa_fwd.tl")
    endpoint_env.script = [fenced(sketch_of(program)), fenced(program)]
    env = {**os.environ, "TLC_LLM_BASE_URL": endpoint_env.base_url, "TLC_LLM_MODEL": "m", "TLC_LLM_API_KEY": SECRET}
    out = tmp_path / "gqa.tl"
    gen = tlc("gen", "GQA, head dim 128, bf16", "--target", "sm_90", "-o", str(out), "--no-build", env=env)
    assert gen.returncode == 0, gen.stderr
    assert SECRET not in gen.stdout + gen.stderr
    check = tlc("check", str(out), env=env)
    assert check.returncode == 0, check.stderr


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mha_fwd", "gqa_fwd", "mqa_fwd", "mla_prefill_fwd"])
def test_tlc_gen_builds_what_the_backend_supports(endpoint_env, tmp_path, name):
    """DESIGN's done-when: the generated .tl passes `tlc build` (NVRTC, about a minute each)."""
    program = (SPECS / f"{name}.tl").read_text()
    endpoint_env.script = [fenced(sketch_of(program)), fenced(program)]
    env = {**os.environ, "TLC_LLM_BASE_URL": endpoint_env.base_url, "TLC_LLM_MODEL": "m"}
    out = tmp_path / f"{name}.tl"
    gen = tlc("gen", request_for(SPECS / f"{name}.tl"), "--target", "sm_90", "-o", str(out), env=env, timeout=900)
    assert gen.returncode == 0, gen.stderr
    meta = json.loads((tmp_path / f"{name}.json").read_text())
    assert meta["arch"] == "sm_90" and (tmp_path / f"{name}.cubin").stat().st_size > 1000
