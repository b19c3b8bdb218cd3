"""setup.cfg ships every package under tlc/: the editable install CI uses finds modules the wheel
would lack (tlc.layout was missing from the wheel until this test)."""
from __future__ import annotations

import configparser
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_tlc_package_is_in_setup_cfg() -> None:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    listed = set(cfg["options"]["packages"].split())
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "tlc").rglob("__init__.py")}
    assert found <= listed, sorted(found - listed)


def test_modules_tlc_imports_directly_are_declared() -> None:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    requires = cfg["options"]["install_requires"]
    for name in ("lark", "networkx", "numpy", "torch", "nvidia-cutlass"):   # pycute ships in nvidia-cutlass
        assert name in requires, name
