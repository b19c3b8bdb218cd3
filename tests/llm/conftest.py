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
    """`llm/` is installed as `tlc_llm` (setup.cfg). Test *this* checkout's `llm/` even when an
    install elsewhere (another clone, a wheel) also provides `tlc_llm`: alias it with a symlink
    placed first on sys.path (and on PYTHONPATH, for the child processes the tests start)."""
    import importlib.util

    spec = importlib.util.find_spec("tlc_llm")
    if spec is not None and spec.origin and Path(spec.origin).resolve().parent == (REPO / "llm").resolve():
        return
    shim = Path(tempfile.mkdtemp(prefix="tlc-llm-shim-"))
    (shim / "tlc_llm").symlink_to(REPO / "llm", target_is_directory=True)
    sys.path[:0] = [str(shim), str(REPO)]
    for name in [m for m in sys.modules if m == "tlc_llm" or m.startswith("tlc_llm.")]:
        del sys.modules[name]
    os.environ["PYTHONPATH"] = os.pathsep.join([str(shim), str(REPO), os.environ.get("PYTHONPATH", "")])


_ensure_import_name()
import tlc_llm  # noqa: E402

assert Path(tlc_llm.__file__).resolve().parent == (REPO / "llm").resolve(), tlc_llm.__file__

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
