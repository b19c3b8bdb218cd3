"""Fixtures for tlc_llm's tests: the import name, a loopback chat server, a tlc gen runner."""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # for `loopback`


def _ensure_import_name() -> None:
    """`llm/` is installed as `tlc_llm` (setup.cfg); in a bare checkout, alias it with a symlink."""
    try:
        import tlc_llm  # noqa: F401
        return
    except ImportError:
        pass
    shim = Path(tempfile.mkdtemp(prefix="tlc-llm-shim-"))
    (shim / "tlc_llm").symlink_to(REPO / "llm", target_is_directory=True)
    sys.path.insert(0, str(shim))
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    # child processes (gpucheck, subprocess CLI tests) need the same view
    os.environ["PYTHONPATH"] = os.pathsep.join([str(shim), str(REPO), os.environ.get("PYTHONPATH", "")])


_ensure_import_name()

from loopback import ScriptedServer  # noqa: E402

SECRET = "sk-test-SECRET-4f9a2c-do-not-leak"


@pytest.fixture
def server():
    with ScriptedServer() as srv:
        yield srv


@pytest.fixture
def endpoint_env(monkeypatch, server):
    """Point tlc gen at the loopback server through the environment, with a recognisable key."""
    monkeypatch.setenv("TLC_LLM_BASE_URL", server.base_url)
    monkeypatch.setenv("TLC_LLM_MODEL", "scripted-model")
    monkeypatch.setenv("TLC_LLM_API_KEY", SECRET)
    monkeypatch.delenv("TLC_DEBUG", raising=False)
    return server


@pytest.fixture
def gen(capsys):
    """Run `tlc gen` in process; returns (exit status, stderr). Tiny timeouts and no backoff sleeps."""
    from tlc_llm.cli import main

    def run(*argv: str) -> tuple[int, str]:
        status = main(["--timeout", "2", "--backoff", "0", *argv])
        captured = capsys.readouterr()
        return status, captured.err + captured.out

    return run


def pytest_collection_modifyitems(config, items):
    """NVRTC builds take a minute or more each: in tests/llm they run only when asked for
    (`-m slow`, `-m gpu`, or TLC_LLM_SLOW=1), so the default run stays well under two minutes."""
    wanted = config.getoption("-m") or ""
    if os.environ.get("TLC_LLM_SLOW") or "slow" in wanted or "gpu" in wanted:
        return
    here = Path(__file__).resolve().parent
    skip = pytest.mark.skip(reason="slow (NVRTC builds): run with -m slow or TLC_LLM_SLOW=1")
    for item in items:
        if "slow" in item.keywords and here in Path(str(item.fspath)).resolve().parents:
            item.add_marker(skip)
