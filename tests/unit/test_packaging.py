"""Packaging: setup.cfg ships every package under tlc/ (the editable install CI uses finds modules the
wheel would lack); the README opens with the two set-up commands, which `.ci/run` runs as written; the
torch pin and the CUDA wheels' bounds are the releases the tests hold on."""
from __future__ import annotations

import configparser
import re
import subprocess
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


# ---------------------------------------------------------------------- the README's commands and the pins
README = ROOT / "README.md"
CI = ROOT / ".ci" / "run"


def _requirements() -> dict:
    from packaging.requirements import Requirement

    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    requirements = [Requirement(line) for line in cfg["options"]["install_requires"].split("\n") if line.strip()]
    return {r.name: r for r in requirements}


def readme_set_up_commands() -> list[str]:
    """The lines of the README's first ```bash block: the two set-up commands."""
    match = re.search(r"^```bash\n(.*?)^```$", README.read_text(), re.S | re.M)
    assert match, "README.md has no ```bash block"
    return match.group(1).splitlines()


def test_readme_opens_with_the_two_set_up_commands() -> None:
    text = README.read_text()
    install, tests = readme_set_up_commands()
    assert text.index("```bash") < text.index("\n## "), "the set-up commands come before the first section"
    assert install.startswith("pip install torch==") and "-e '.[dev]'" in install
    assert tests.startswith("python3 -m pytest ")


def test_readme_test_command_shows_progress_and_leaves_slow_tests_to_their_own_command() -> None:
    tests = readme_set_up_commands()[1].split()
    assert "-q" not in tests and "--quiet" not in tests      # a line per file with the share done, not only dots
    assert readme_set_up_commands()[1].endswith('-m "not slow"')
    slow = [line for line in README.read_text().splitlines() if line.startswith("python3 -m pytest -m slow")]
    assert len(slow) == 1, slow


def test_ci_runs_the_readme_commands_as_written() -> None:
    printed = subprocess.run(["bash", str(CI), "--print-commands"], capture_output=True, text=True, check=True,
                             timeout=60).stdout.splitlines()
    slow = [line for line in README.read_text().splitlines() if line.startswith("python3 -m pytest -m slow")]
    assert printed == readme_set_up_commands() + slow
    # CI installs torch and runs the suite only through those lines; its own pytest run is the NVRTC 13.0 leg.
    code = [line for line in CI.read_text().splitlines() if not line.lstrip().startswith("#")]
    assert not any("torch==" in line for line in code)
    assert all("tests/nvrtc" in line for line in code if line.lstrip().startswith(("python3 -m pytest", "pytest")))


def test_the_readme_torch_pin_and_the_cuda_wheels_are_within_setup_cfg() -> None:
    requirements = _requirements()
    pin = re.search(r"torch==([\d.]+)", readme_set_up_commands()[0])
    assert pin and requirements["torch"].specifier.contains(pin.group(1))
    for name in ("cuda-python", "nvidia-cuda-nvrtc", "nvidia-cuda-runtime", "nvidia-cuda-cccl", "nvidia-cutlass"):
        operators = {s.operator for s in requirements[name].specifier}
        assert operators & {"<", "=="} and operators & {">=", "=="}, f"{name} is bounded on both sides"
    assert not requirements["nvidia-cuda-cccl"].specifier.contains("13.2.86")   # CuTe 4.2 fails to compile with it


def test_setup_cfg_admits_exactly_the_nvrtc_releases_the_tests_were_measured_with() -> None:
    """The NVRTC tests' ptxas expectations are keyed by NVRTC's major.minor; the install admits the releases
    from the lowest to the highest measured one (13.0: torch's CUDA 13.0 builds and the GPU machines)."""
    from tests.nvrtc.test_sm90a_nvrtc import PTXAS_BY_VERSION

    spec = _requirements()["nvidia-cuda-nvrtc"].specifier
    measured = sorted(PTXAS_BY_VERSION, key=lambda v: tuple(map(int, v.split("."))))
    low, high = measured[0], measured[-1]
    assert spec.contains(f"{low}.0") and spec.contains(f"{high}.99")
    major, minor = map(int, high.split("."))
    assert not spec.contains(f"{major}.{minor + 1}.0") and not spec.contains("12.9.86")


def test_readme_is_a_short_tour_whose_links_resolve() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 150, "the README is a tour; logs and long sections live in docs/"
    assert "| config | tlc sm_90a | SDPA FA2 | cuDNN | tlc / FA2 | tlc / cuDNN |" in text    # the bar table
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        if "://" not in target:
            assert (ROOT / target).exists(), target
