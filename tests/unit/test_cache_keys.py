"""Cache keys hash a canonical encoding of every input: two different builds never share a key, whatever
bytes their defines, file names or options hold, so a warm cache never serves one build's kernel for another."""
from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import tlc.backend_cute.compile as compile_mod
from tlc import runtime
from tlc.backend_cute import cache
from tlc.backend_cute.nvrtc import NvrtcResult
from tlc.diagnostics import TlcError

MHA = Path(__file__).resolve().parents[2] / "specs" / "mha_fwd.tl"
EXAMPLES = settings(max_examples=200, deadline=None, database=None, derandomize=True)
TRICKY = st.text(alphabet="\0=\n;:BM64 ,'\"", max_size=8)  # the bytes a joined encoding would confuse


def _nested():
    leaves = st.none() | st.booleans() | st.integers() | TRICKY | st.binary(max_size=6)
    return st.recursive(leaves, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TRICKY, inner, max_size=3),
                        max_leaves=8)


def _decode(blob: bytes, at: int = 0):
    """Read `cache.canonical`'s encoding back: that it can be read back at all proves no two values share it."""
    tag, at = blob[at:at + 1], at + 1
    if tag in (b"N", b"T", b"F"):
        return {b"N": None, b"T": True, b"F": False}[tag], at
    if tag == b"i":
        end = blob.index(b";", at)
        return int(blob[at:end], 16), end + 1
    end = blob.index(b":", at)
    size, at = int(blob[at:end]), end + 1
    if tag in (b"s", b"b"):
        data = blob[at:at + size]
        return (data.decode("utf-8", "surrogatepass") if tag == b"s" else data), at + size
    items = []
    for _ in range(size * (2 if tag == b"d" else 1)):
        item, at = _decode(blob, at)
        items.append(item)
    return (dict(zip(items[::2], items[1::2])) if tag == b"d" else items), at


def _exact(value):
    """`value` with each leaf tagged by its type, so 1, True and b"1" compare unequal."""
    if isinstance(value, list):
        return ("list", tuple(_exact(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple(sorted((k, _exact(v)) for k, v in value.items())))
    return (type(value).__name__, value)


@EXAMPLES
@given(_nested())
def test_the_canonical_encoding_reads_back_exactly(value) -> None:
    blob = cache.canonical(value)
    back, end = _decode(blob)
    assert end == len(blob) and _exact(back) == _exact(value)


@EXAMPLES
@given(_nested(), _nested())
@example({"BM": "64\0HeadDim=64"}, {"BM": "64", "HeadDim": "64"})
@example(["a\0b"], ["a", "b"])
@example(1, True)
@example("x", b"x")
def test_different_values_never_share_an_encoding(a, b) -> None:
    if _exact(a) != _exact(b):
        assert cache.canonical(a) != cache.canonical(b)


def test_keys_refuse_values_they_cannot_encode_exactly() -> None:
    for value in (1.5, Path("x"), {1: "a"}, object()):
        with pytest.raises(TypeError):
            cache.canonical(value)


DEFINES = st.dictionaries(TRICKY, TRICKY, max_size=3)


@EXAMPLES
@given(DEFINES, DEFINES, st.binary(max_size=6), st.binary(max_size=6), TRICKY, TRICKY)
@example({"BM": "64\0HeadDim=64"}, {"BM": "64", "HeadDim": "64"}, b"", b"", "x.tl", "x.tl")
@example({}, {}, b"P\0x.tl", b"P", "x.tl", "x.tl\0x.tl")  # a part's tail read as the next part
def test_different_build_inputs_get_different_index_keys(defs_a, defs_b, tl_a, tl_b, name_a, name_b) -> None:
    key_a = runtime.build_inputs_key(tl_a, name_a, defs_a, "sm_90", False)
    key_b = runtime.build_inputs_key(tl_b, name_b, defs_b, "sm_90", False)
    assert (key_a == key_b) == ((defs_a, tl_a, name_a) == (defs_b, tl_b, name_b))


@EXAMPLES
@given(st.lists(TRICKY, max_size=3), st.lists(TRICKY, max_size=3), TRICKY, TRICKY)
@example(["-a\0-b"], ["-a", "-b"], "", "")
@example([], [], "src\0sm_90", "src")
def test_different_compiles_get_different_cubin_keys(options_a, options_b, source_a, source_b) -> None:
    key_a = cache.cache_key(source_a, "sm_90", options_a, "13.0")
    key_b = cache.cache_key(source_b, "sm_90", options_b, "13.0")
    assert (key_a == key_b) == ((options_a, source_a) == (options_b, source_b))


def test_a_define_holding_nul_is_not_served_another_builds_kernel(tmp_path, monkeypatch) -> None:
    """`-D BM='64<NUL>HeadDim=64'` is refused cold; it stays refused once BM=64, HeadDim=64 is cached."""
    monkeypatch.setenv("TLC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TLC_ALWAYS_COMPILE", raising=False)
    monkeypatch.setattr(compile_mod, "compile_cubin", lambda source, arch, name="k.cu", extra_options=():
                        NvrtcResult(b"\x7fELF fake", "", 0.0, [f"-arch={arch}"]))
    cache.clear_memory()
    crafted = {"BM": "64\0HeadDim=64"}
    with pytest.raises(TlcError, match="-D BM"):
        runtime.compile_spec(MHA, arch="sm_90", defines=crafted)
    runtime.compile_spec(MHA, arch="sm_90", defines={"BM": 64, "HeadDim": 64})
    cache.clear_memory()
    with pytest.raises(TlcError, match="-D BM"):
        runtime.compile_spec(MHA, arch="sm_90", defines=crafted)
