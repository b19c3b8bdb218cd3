"""tests/gpu/conftest.py: after a test loses the CUDA context (a kernel's illegal instruction, say), the
later GPU tests fail at once naming that test, instead of each failing with the same copied error."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFTEST = ROOT / "tests" / "gpu" / "conftest.py"
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}   # the conftest's time limit is bench.watchdog


def test_later_tests_name_the_test_that_lost_the_context(tmp_path: Path) -> None:
    shutil.copy(CONFTEST, tmp_path / "conftest.py")
    (tmp_path / "test_x.py").write_text(
        "def test_a():\n    pass\n"
        "def test_b():\n    raise RuntimeError('CUDA error: an illegal instruction was encountered')\n"
        "def test_c():\n    pass\n"
        "def test_d():\n    raise RuntimeError('CUDA error: out of memory')\n")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                         capture_output=True, text=True, cwd=tmp_path, timeout=120, env=ENV)
    out = run.stdout
    assert "1 failed, 1 passed, 2 errors" in out, out
    assert out.count("not run: the CUDA context was lost earlier, in test_x.py::test_b") >= 2, out


def test_an_error_that_keeps_the_context_changes_nothing(tmp_path: Path) -> None:
    shutil.copy(CONFTEST, tmp_path / "conftest.py")
    (tmp_path / "test_y.py").write_text(
        "def test_a():\n    raise RuntimeError('CUDA error: out of memory')\n"
        "def test_b():\n    pass\n")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                         capture_output=True, text=True, cwd=tmp_path, timeout=120, env=ENV)
    assert "1 failed, 1 passed" in run.stdout, run.stdout


def test_a_test_that_stalls_ends_the_run_naming_it(tmp_path: Path) -> None:
    shutil.copy(CONFTEST, tmp_path / "conftest.py")
    (tmp_path / "test_z.py").write_text("import time\ndef test_a():\n    pass\ndef test_stuck():\n    time.sleep(60)\n")
    env = {**ENV, "TLC_GPU_TEST_TIMEOUT": "2"}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                         capture_output=True, text=True, cwd=tmp_path, timeout=50, env=env)
    assert run.returncode == 3
    assert "test_z.py::test_stuck: still running after 2 s (a kernel that hangs?)" in run.stderr, run.stderr
