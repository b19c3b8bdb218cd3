"""The build index holds data only: versioned JSON naming nothing but tlc's kernel-IR and ABI classes.
The kernel IR of every shipped spec reads back exactly; a pickle, an unknown class, a torn file, another
version or another key's entry is a miss that runs nothing and is rebuilt."""
from __future__ import annotations

import json
import math
import os
import pickle
from dataclasses import replace
from pathlib import Path

import pytest

import tlc.backend_cute.compile as compile_mod
from tlc.backend_cute import cache, kir_codec
from tlc.backend_cute.nvrtc import NvrtcResult
from tlc.builder import lower_to_kernel_ir
from tlc.diagnostics import TlcError
from tlc.expr.nodes import Const
from tlc.names import kernel_name
from tlc.attention.kernels import attention_spec
from tlc.runtime import compile_spec, normal_defines
from tests.spec_files import ONE_KERNEL_SPECS

SPECS = ONE_KERNEL_SPECS
MHA = SPECS[[s.name for s in SPECS].index("mha_fwd.tl")]


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TLC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TLC_ALWAYS_COMPILE", raising=False)
    monkeypatch.setattr(compile_mod, "compile_cubin", lambda source, arch, name="k.cu", extra_options=():
                        NvrtcResult(b"\x7fELF fake " + arch.encode(), "", 0.0, [f"-arch={arch}"]))
    cache.clear_memory()
    yield tmp_path / "cache"
    cache.clear_memory()


def _index(cache_dir: Path) -> Path:
    (entry,) = cache_dir.rglob("*.build")
    return entry


def _warm(defines=None):
    """compile_spec as a fresh process would run it: only the disk; whether the index served it."""
    cache.clear_memory()
    compiled, _ = compile_spec(MHA, arch="sm_90", defines=defines or {"HeadDim": 64})
    return set(compiled.timings) == {"index"}


# ---------------------------------------------------------------------- exact round trip
def _builds():
    """Each shipped spec with its own Params, and the builds tlc.attention makes, for each target."""
    for arch in ("sm_80", "sm_90", "sm_90a"):
        for spec in SPECS:
            yield spec, {}, arch
        for d_qk, d_v in ((64, 64), (128, 128), (192, 128)):
            for causal in (False, True):
                yield (*attention_spec("bf16", d_qk, d_v, causal, arch), arch)


def _lowered():
    for spec, defines, arch in _builds():
        defs = normal_defines(defines)
        try:
            state, _ = lower_to_kernel_ir(spec.read_bytes(), str(spec), arch, defs, name=kernel_name(str(spec)))
        except TlcError:
            continue  # a target that refuses the spec
        yield f"{spec.stem}{sorted(defs.items())}@{arch}", state


def test_every_shipped_specs_kernel_ir_reads_back_exactly() -> None:
    seen = []
    for label, state in _lowered():
        written = json.dumps(kir_codec.encode({"program": state.kir, "abi": state.abi}))
        back = kir_codec.decode(json.loads(written))
        assert back == {"program": state.kir, "abi": state.abi}, label
        assert json.dumps(kir_codec.encode(back)) == written, label  # the same types too (1 is not True)
        seen.append(label)
    assert len(seen) >= 30 and sum(label.endswith("@sm_90a") for label in seen) >= 10


def test_numbers_keep_their_types_and_signs() -> None:
    values = (Const(1), Const(True), Const(1.0), Const(0.0), Const(-0.0), Const(math.inf), Const(False), Const(0))
    back = kir_codec.decode(json.loads(json.dumps(kir_codec.encode({"c": values}))))["c"]
    assert [type(c.value) for c in back] == [type(c.value) for c in values]
    assert [math.copysign(1, c.value) for c in back] == [math.copysign(1, c.value) for c in values]


def test_the_allow_list_names_each_class_once() -> None:
    assert len(kir_codec.ALLOWED) == len(kir_codec._DATA_CLASSES)
    assert all(isinstance(cls, type) and cls.__module__.startswith("tlc.") for cls in kir_codec.ALLOWED.values())


def test_a_program_holding_non_data_is_not_indexed(tmp_cache, monkeypatch) -> None:
    import tlc.builder

    real = tlc.builder.lower_to_kernel_ir

    def with_a_list(*args, **kw):
        state, remarks = real(*args, **kw)
        state.kir = replace(state.kir, body=list(state.kir.body))  # a list where the IR has tuples
        return state, remarks
    monkeypatch.setattr(tlc.builder, "lower_to_kernel_ir", with_a_list)
    assert not compile_spec(MHA, arch="sm_90", defines={"HeadDim": 64})[0].cached
    assert not list(tmp_cache.rglob("*.build")) and list(tmp_cache.rglob("*.cubin"))


# ---------------------------------------------------------------------- the entry on disk
def test_the_entry_is_versioned_json(tmp_cache) -> None:
    cold, abi = compile_spec(MHA, arch="sm_90", defines={"HeadDim": 64})
    blob = _index(tmp_cache).read_bytes()
    assert blob.startswith(b"TLCBUILD2\n")
    doc = json.loads(blob[len(b"TLCBUILD2\n"):])
    assert doc["format"] == "tlc.build-index" and doc["version"] == 2 and doc["cubin_key"] == cold.metadata["cache_key"]
    assert _warm()
    warm, warm_abi = compile_spec(MHA, arch="sm_90", defines={"HeadDim": 64})
    assert warm.program == cold.program and warm_abi == abi and warm.source == cold.source


class _Payload:
    """Unpickling this calls os.system: what a planted pickle entry would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize("magic", [b"TLCBUILD1\n", b"TLCBUILD2\n"])
def test_a_pickle_entry_runs_nothing_and_is_rebuilt(tmp_cache, tmp_path, magic) -> None:
    compile_spec(MHA, arch="sm_90", defines={"HeadDim": 64})
    marker = tmp_path / "ran"
    _index(tmp_cache).write_bytes(magic + pickle.dumps({"program": _Payload(marker)}))
    assert not _warm()
    assert not marker.exists()
    assert _warm()  # the rebuild wrote a good entry over it


def _edit(entry: Path, change) -> None:
    blob = entry.read_bytes()
    doc = json.loads(blob[len(cache._INDEX_MAGIC):])
    change(doc)
    entry.write_bytes(cache._INDEX_MAGIC + json.dumps(doc).encode())


def _rename_class(old: str, new: str):
    def change(doc) -> None:
        node = next(n for n in doc["ir"]["nodes"] if n[0] == old)
        node[0] = new
    return change


@pytest.mark.parametrize("change", [
    _rename_class("Var", "os.system"), _rename_class("Var", "Path"), _rename_class("Loc", "Note"),
    lambda doc: doc["ir"]["nodes"].append(["subprocess.Popen", ["touch", "x"]]),
    lambda doc: doc["ir"]["nodes"][0].append(7),                              # one field too many
    lambda doc: doc["ir"]["roots"].update(program={"@": len(doc["ir"]["nodes"])}),  # a node that is not there
    lambda doc: doc["ir"]["nodes"][0].__setitem__(1, {"@": 0}),                 # a node naming itself
    lambda doc: doc["ir"]["roots"].update(program={"@": 0}),                   # not a ProgramOp
    lambda doc: doc["ir"]["nodes"].insert(0, ["Var", "not a name"]),           # data Var refuses
    lambda doc: doc.update(version=3), lambda doc: doc.update(version="2"), lambda doc: doc.update(version=True),
    lambda doc: doc.update(format="tlc.other"), lambda doc: doc.update(build_key="ab" * 32),
    lambda doc: doc.pop("source"), lambda doc: doc.update(cubin_key=None), lambda doc: doc.update(ir=[]),
], ids=["os.system", "Path", "Note", "Popen", "arity", "dangling", "self", "not-program", "bad-var", "version-3",
        "version-str", "version-bool", "format", "key", "no-source", "cubin-key", "ir-list"])
def test_a_foreign_entry_is_a_miss_and_is_rebuilt(tmp_cache, change) -> None:
    compile_spec(MHA, arch="sm_90", defines={"HeadDim": 64})
    _edit(_index(tmp_cache), change)
    assert not _warm()
    assert _warm()


def test_a_torn_entry_is_a_miss_and_is_rebuilt(tmp_cache) -> None:
    compile_spec(MHA, arch="sm_90", defines={"HeadDim": 64})
    entry = _index(tmp_cache)
    whole = entry.read_bytes()
    for cut in (0, 5, len(cache._INDEX_MAGIC), len(whole) // 2, len(whole) - 1):
        entry.write_bytes(whole[:cut])
        assert not _warm(), cut
        assert _warm(), cut


def test_another_builds_entry_under_this_key_is_a_miss(tmp_cache) -> None:
    compile_spec(MHA, arch="sm_90", defines={"HeadDim": 64})
    small = _index(tmp_cache)
    compile_spec(MHA, arch="sm_90", defines={"HeadDim": 128})
    (large,) = set(tmp_cache.rglob("*.build")) - {small}
    large.write_bytes(small.read_bytes())  # the d=64 build's entry where d=128's belongs
    assert not _warm({"HeadDim": 128})
    expected, _ = lower_to_kernel_ir(MHA.read_bytes(), str(MHA), "sm_90", {"HeadDim": "128"}, name="mha_fwd")
    assert _warm({"HeadDim": 128})
    assert compile_spec(MHA, arch="sm_90", defines={"HeadDim": 128})[0].program == expected.kir
