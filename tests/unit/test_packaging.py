"""The shipped specs are package data (`tlc_specs`), found through importlib.resources in an
editable or a wheel install; `.ci/run` also checks a wheel installed into a fresh venv."""
from __future__ import annotations

from importlib import metadata, resources
from pathlib import Path

import pytest

import tlc.runtime

CHECKOUT_SPECS = Path(__file__).resolve().parents[2] / "specs"


@pytest.fixture(autouse=True)
def installed() -> None:
    try:
        metadata.distribution("tlc")
    except metadata.PackageNotFoundError:  # a checkout on PYTHONPATH (bench/README.md's device recipe)
        pytest.skip("tlc is not installed here: nothing to check about its package data")


def test_the_shipped_specs_are_found_through_importlib_resources() -> None:
    root = resources.files("tlc_specs")
    shipped = {p.name for p in root.iterdir() if p.is_file()}
    assert {p.name for p in CHECKOUT_SPECS.glob("*.tl")} <= shipped and "LANGUAGE.md" in shipped
    assert (root / "gqa_fwd.tl").read_text(encoding="utf-8").startswith("#")


def test_tlc_attention_builds_from_the_installed_specs() -> None:
    spec, defines = tlc.runtime.attention_spec("bf16", 192, 128, True)
    assert spec.parent == tlc.runtime.specs_dir() == Path(str(resources.files("tlc_specs")))
    assert spec.name == "mla_prefill_fwd.tl" and spec.is_file() and defines["DQK"] == 192
