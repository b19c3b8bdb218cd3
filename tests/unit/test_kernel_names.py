"""File names are the user's: any `.tl` name builds into a kernel with a valid C++ name (no NVRTC)."""
from __future__ import annotations

from pathlib import Path

import pytest

from tlc.builder import lower_to_kernel_ir
from tlc.names import kernel_name

MHA = (Path(__file__).resolve().parents[2] / "specs" / "mha_fwd.tl").read_bytes()


@pytest.mark.parametrize("file,want", [("my-attn.tl", "my_attn"), ("2attn.tl", "k_2attn"), ("a.b.tl", "a_b"),
                                       ("ünï.tl", "n"), ("---.tl", "tl_kernel"), ("dir/mha_fwd.tl", "mha_fwd")])
def test_kernel_name_is_a_cpp_identifier(file, want) -> None:
    assert kernel_name(file) == want


@pytest.mark.parametrize("file", ["my-attn.tl", "2attn.tl", "a.b.tl", "ünï.tl"])
def test_a_file_named_freely_lowers(tmp_path, file) -> None:
    path = tmp_path / file
    path.write_bytes(MHA)
    state, _ = lower_to_kernel_ir(MHA, str(path), "sm_90", {"HeadDim": "64"}, name=kernel_name(path))
    state.kir.verify()
    assert state.kir.name == kernel_name(path) and state.kir.kernels()[0].name == kernel_name(path)
