"""File names are the user's: any `.tl` name builds into a kernel with a valid C++ name (no NVRTC)."""
from __future__ import annotations

from pathlib import Path

import pytest

from tlc.builder import lower_to_kernel_ir
from tlc.names import kernel_name

MHA = (Path(__file__).resolve().parents[2] / "specs" / "mha_fwd.tl").read_bytes()
ODD_NAMES = ["my-attn.tl", "2attn.tl", "a.b.tl", "ünï.tl", "int.tl", "tlc.tl", "a--b.tl", "_X.tl", "注意.tl"]


@pytest.mark.parametrize("file,want", [("my-attn.tl", "my_attn"), ("2attn.tl", "k_2attn"), ("a.b.tl", "a_b"),
                                       ("ünï.tl", "uni"), ("---.tl", "tl_kernel"), ("注意.tl", "tl_kernel"),
                                       ("dir/mha_fwd.tl", "mha_fwd"), ("<text>", "tl_kernel"),
                                       ("int.tl", "k_int"), ("class.tl", "k_class"), ("tlc.tl", "k_tlc"),
                                       ("cute.tl", "k_cute"), ("threadIdx.tl", "k_threadIdx"),
                                       ("a--b.tl", "a_b"), ("_X.tl", "X"), ("__init__.tl", "init")])
def test_kernel_name_is_a_cpp_identifier(file, want) -> None:
    assert kernel_name(file) == want


def _fake_compile(seen: list):
    """compile_kir without NVRTC: emits the CuTe source (names checked there too) and a fake cubin."""
    from tlc.backend_cute.compile import CompiledKernel, kernel_metadata
    from tlc.backend_cute.emit import emit_program

    def compile_kir(program, arch, *, source_name="<kir>", cu_name=None, line_directives=True):
        seen.append((program.name, cu_name))
        source = emit_program(program, source=source_name, cu_name=cu_name or "k.cu")
        return CompiledKernel(program, arch, source, b"\x7fELF", kernel_metadata(program, arch), 0.0, True,
                              [k.name for k in program.kernels()])
    return compile_kir


@pytest.mark.parametrize("file", ODD_NAMES)
def test_a_file_named_freely_lowers(tmp_path, file) -> None:
    path = tmp_path / file
    path.write_bytes(MHA)
    state, _ = lower_to_kernel_ir(MHA, str(path), "sm_90", {"HeadDim": "64"}, name=kernel_name(path))
    state.kir.verify()
    assert state.kir.name == kernel_name(path) and state.kir.kernels()[0].name == kernel_name(path)


@pytest.mark.parametrize("file", ["my-attn.tl", "2attn.tl", "a.b.tl", "int.tl"])
def test_tlc_build_names_the_kernel_safely_and_keeps_the_users_stem(tmp_path, monkeypatch, capsys, file) -> None:
    import tlc.backend_cute.compile
    from tlc.cli import main

    seen: list = []
    monkeypatch.setattr(tlc.backend_cute.compile, "compile_kir", _fake_compile(seen))
    (tmp_path / file).write_bytes(MHA)
    out = tmp_path / "out"
    assert main(["build", str(tmp_path / file), "-D", "HeadDim=64", "-o", str(out)]) == 0, capsys.readouterr().err
    stem = Path(file).stem
    assert seen == [(kernel_name(file), f"{stem}.cu")]
    assert sorted(p.name for p in out.iterdir()) == sorted(f"{stem}{s}" for s in (".cu", ".cubin", ".json"))


def test_tlc_build_in_python_names_the_kernel_safely(tmp_path, monkeypatch) -> None:
    import tlc.backend_cute.compile
    import tlc.backend_cute.launch
    import tlc.runtime

    seen: list = []
    monkeypatch.setattr(tlc.backend_cute.compile, "compile_kir", _fake_compile(seen))
    monkeypatch.setattr(tlc.backend_cute.launch, "Kernel", lambda compiled, abi: compiled)
    (tmp_path / "my-attn.tl").write_bytes(MHA)
    compiled = tlc.runtime.build(tmp_path / "my-attn.tl", arch="sm_90", defines={"HeadDim": 64})
    assert seen == [("my_attn", "my-attn.cu")] and compiled.program.name == "my_attn"
