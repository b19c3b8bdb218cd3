"""Structural variants of specs/mha_fwd.tl: programs that mean something other than MHA.

Each either builds into a kernel that computes what it says (the emitted CuTe differs from
MHA's, and on a GPU the kernel equals the TL interpreter) or is refused at its line.
"""
from __future__ import annotations

from pathlib import Path

MHA = (Path(__file__).resolve().parents[2] / "specs" / "mha_fwd.tl").read_text()
LOOP = "for n = 0:seqlen_k / BN"
PV = "  Compute GEMM P, V and accumulate O"
V_LOAD = "  Copy V (BN, HeadDim) in coordinate [L = n] from global to shared\n"


def _sub(old: str, new: str, text: str = MHA) -> str:
    assert old in text, old
    return text.replace(old, new)


# name → program text; all must differ from MHA in the kernel they build
BUILDS = {
    "half_loop": _sub(LOOP, "for n = 0:seqlen_k / BN / 2"),
    "loop_from_1": _sub(LOOP, "for n = 1:seqlen_k / BN"),
    "kv_at_0": MHA.replace("in coordinate [L = n]", "in coordinate [L = 0]"),
    "gemm_pk": _sub(PV, "  Compute GEMM P, K and accumulate O"),
    "scale_twice": _sub("  Compute Multiply S, scale and get new S\n",
                        "  Compute Multiply S, scale and get new S\n  Compute Multiply S, scale and get new S\n"),
    "o_plus_one": _sub("Compute Divide O, l and get new O\n", "Compute Divide O, l and get new O\nCompute Add O, 1.0 and get new O\n"),
    # reads the row max it named: m must stay the max of the scaled scores (no scale folding)
    "o_plus_max": _sub("Compute Divide O, l and get new O\n", "Compute Divide O, l and get new O\nCompute Add O, m and get new O\n"),
}
# name → (program text, the line the refusal must point at: a substring of that line)
REFUSED = {
    "no_store": (_sub("Copy O (BM, HeadDim) in coordinate [L = block_idx] from register to global", ""), None),
    "q_global_to_register": (
        _sub("Copy Q (BM, HeadDim) in coordinate [L = block_idx] from global to shared\nCopy Q from shared to register",
             "Copy Q (BM, HeadDim) in coordinate [L = block_idx] from global to register"),
        "from global to register"),
    "v_after_use": (_sub(V_LOAD, "", _sub(PV, PV + "\n" + V_LOAD.rstrip("\n"))), None),
}


def write(tmp: Path, name: str, text: str) -> Path:
    path = tmp / f"{name}.tl"
    path.write_text(text)
    return path
