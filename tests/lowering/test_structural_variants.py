"""The TL program drives the kernel: structural variants of MHA build into different CuTe, or are
refused at a location — none builds into the MHA kernel (emitted source only: no NVRTC)."""
from __future__ import annotations

import re

import pytest

from tests.lowering.variants import BUILDS, MHA, REFUSED, write
from tlc.diagnostics import TlcError
from tlc.lowering.emit_text import emit_text


def _cute(path, arch: str = "sm_90") -> str:
    return emit_text(path.read_bytes(), str(path), arch, {}, "cute", line_directives=False)


@pytest.fixture(scope="module")
def mha_cute(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mha")
    return {arch: _cute(write(folder, "mha_fwd", MHA), arch) for arch in ("sm_90", "sm_90a")}


@pytest.mark.parametrize("name", sorted(BUILDS))
def test_variant_builds_into_a_different_kernel(name, tmp_path, mha_cute):
    src = _cute(write(tmp_path, "mha_fwd", BUILDS[name]))
    assert src != mha_cute["sm_90"]


@pytest.mark.parametrize("name", sorted(BUILDS))
def test_on_sm90a_a_variant_differs_or_is_refused_at_a_line(name, tmp_path, mha_cute):
    """The wgmma lowering lowers fewer GEMM forms: what it cannot take is refused where it is written."""
    path = write(tmp_path, "mha_fwd", BUILDS[name])
    try:
        src = _cute(path, "sm_90a")
    except TlcError as exc:
        loc = exc.diagnostics[0].loc
        assert loc is not None and loc.line > 0 and "GEMM" in BUILDS[name].splitlines()[loc.line - 1]
        return
    assert "wgmma" in src and src != mha_cute["sm_90a"]


@pytest.mark.parametrize("arch", ["sm_90", "sm_90a"])
@pytest.mark.parametrize("name", sorted(REFUSED))
def test_variant_is_refused_at_a_line(name, arch, tmp_path):
    text, where = REFUSED[name]
    path = write(tmp_path, name, text)
    with pytest.raises(TlcError) as exc:
        _cute(path, arch)
    diag = exc.value.diagnostics[0]
    if where is not None:
        assert diag.loc is not None and diag.loc.line > 0
        assert where in text.splitlines()[diag.loc.line - 1]


def test_loop_bounds_reach_the_kernel(tmp_path):
    half = _cute(write(tmp_path, "a", BUILDS["half_loop"]))
    from1 = _cute(write(tmp_path, "b", BUILDS["loop_from_1"]))
    assert "tlc::ceil_div(tlc::ceil_div(p.seqlen_k, 64), 2)" in half
    assert "for (int n = 1;" in from1


def test_three_gemms_lower_to_three_mmas():
    from pathlib import Path
    spec = Path(__file__).resolve().parents[2] / "specs" / "chain3_fwd.tl"
    src = emit_text(spec.read_bytes(), str(spec), "sm_90", {}, "cute", line_directives=False)
    calls = re.findall(r"tiled_mma\.call\(d_, (\w+)\(_, m_s, \w+\), (\w+)\(_, n_, \w+\), d_\);", src)
    assert len(calls) == 3 and len(set(calls)) == 3, calls   # one MMA per GEMM, each on its own operands


NARROW = (MHA.replace("Param HeadDim = 128", "Param HeadDim = 64\nParam DQ = 32")
          .replace("Allocate Q in shared (BM, HeadDim)", "Allocate Q in shared (BM, DQ)")
          .replace("Allocate K in shared (BN, HeadDim)", "Allocate K in shared (BN, DQ)")
          .replace("Copy Q (BM, HeadDim) in coordinate [L = block_idx] from global",
                   "Copy Q (BM, DQ) in coordinate [L = block_idx] from global")
          .replace("Copy K (BN, HeadDim) in coordinate [L = n]", "Copy K (BN, DQ) in coordinate [L = n]"))


def test_a_tile_narrower_than_its_tensor_is_not_padded_into_the_tensors_columns(tmp_path):
    """Q and K tiles of 32 of the tensors' 64 columns: sm_90a pads tiles to 64 columns, which would read
    columns 32..63 (TMA zero-fills only past the tensor's end), so it is refused at the copy; the sm_80
    family copies 32-column tiles as they are."""
    path = write(tmp_path, "narrow", NARROW)
    assert "Copy Q (BM, DQ)" in NARROW and "Copy K (BN, DQ)" in NARROW
    _cute(path, "sm_90")
    with pytest.raises(TlcError, match="padded to 64") as exc:
        _cute(path, "sm_90a")
    loc = exc.value.diagnostics[0].loc
    assert "Copy Q (BM, DQ)" in NARROW.splitlines()[loc.line - 1]


def test_a_padded_column_tile_past_the_first_is_refused(tmp_path):
    """A 40-column tile at [C = 1] of an 80-column tensor: padded to 64, its view would start at column 64."""
    text = NARROW.replace("Param HeadDim = 64\nParam DQ = 32", "Param HeadDim = 80\nParam DQ = 40").replace(
        "Copy K (BN, DQ) in coordinate [L = n]", "Copy K (BN, DQ) in coordinate [L = n, C = 1]")
    with pytest.raises(TlcError, match="padded to 64"):
        _cute(write(tmp_path, "narrow40", text), "sm_90")


def test_a_padded_width_that_becomes_a_row_count_is_explained():
    """chain3 with N2 = 32: C's 32 columns pad to 64 on sm_90a, so T = S·C is 64 wide while D has 32 rows; the
    refusal says so rather than reporting operand shapes the program never wrote."""
    from pathlib import Path
    spec = Path(__file__).resolve().parents[2] / "specs" / "chain3_fwd.tl"
    with pytest.raises(TlcError, match="pads tile widths to multiples of 64") as exc:
        emit_text(spec.read_bytes(), str(spec), "sm_90a", {"K1": "32", "N2": "32"}, "cute", line_directives=False)
    assert "Compute GEMM T, D" in spec.read_text().splitlines()[exc.value.diagnostics[0].loc.line - 1]
