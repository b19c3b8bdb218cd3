"""SASS of a cubin (cuobjdump): its opcodes, its loops, and the counts of the instructions a kernel was meant to use."""
from __future__ import annotations

import collections
import os
import re
import shutil
import subprocess
import tempfile

_OPCODE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")


def _wheel_bin() -> str:
    """The bin directory of the nvidia-cuda-cuobjdump / -nvdisasm wheels (no toolkit needed: a CPU
    machine can list SASS too), or ''."""
    try:
        import nvidia
    except ImportError:
        return ""
    for root in nvidia.__path__:
        for sub in ("cu13/bin", "cuda_cuobjdump/bin"):
            if os.path.exists(os.path.join(root, sub, "cuobjdump")):
                return os.path.join(root, sub)
    return ""


def sass_listing(cubin: bytes) -> str:
    """`cuobjdump -sass` of the cubin; SystemExit with one line where cuobjdump is missing or fails."""
    wheel = _wheel_bin()
    exe = shutil.which("cuobjdump") or (os.path.join(wheel, "cuobjdump") if wheel else "/usr/local/cuda/bin/cuobjdump")
    if not os.path.exists(exe):
        raise SystemExit("cuobjdump not found: it comes with the CUDA toolkit on the GPU machine, or `pip install "
                         "nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm` anywhere")
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    env = dict(os.environ, PATH=os.environ.get("PATH", "") + (os.pathsep + wheel if wheel else ""))
    try:
        done = subprocess.run([exe, "-sass", f.name], capture_output=True, text=True, env=env)
    finally:
        os.unlink(f.name)
    if done.returncode:
        raise SystemExit(f"cuobjdump -sass failed: {done.stderr.strip().splitlines()[-1:] or done.returncode}")
    return done.stdout


def opcodes(listing: str) -> collections.Counter:
    """Each instruction's opcode with its modifiers (predicates dropped), counted."""
    return collections.Counter(m.group(1) for m in map(_OPCODE.search, listing.splitlines()) if m)


_INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?);")
_BRANCH = re.compile(r"\bBRA(?:\.[A-Z.]+)?\s+.*?0x([0-9a-f]+)")


def loops(listing: str, containing: tuple[str, ...] = ("HMMA", "HGMMA", "UTMALDG")) -> list[tuple[int, int, collections.Counter]]:
    """(first address, last address, opcode counts) of each backward branch's body that holds one of
    `containing` (the steady KV loops, the TMA producer's loops), in listing order. A loop's count is
    every instruction from the branch target to the branch, inner loops included."""
    body = [(int(m.group(1), 16), m.group(2).strip()) for m in _INSTRUCTION.finditer(listing)]
    index = {addr: i for i, (addr, _) in enumerate(body)}
    out = []
    for i, (addr, text) in enumerate(body):
        branch = _BRANCH.search(text)
        target = int(branch.group(1), 16) if branch else None
        if target is None or target >= addr or target not in index:
            continue
        ops = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", t).split()[0] for _, t in body[index[target]:i + 1])
        if any(op.split(".")[0] in containing for op in ops):
            out.append((target, addr, ops))
    return out


def sass_summary(cubin: bytes) -> dict:
    """Counts of the instructions the recipe needs (HMMA or HGMMA, LDGSTS or UTMALDG, LDSM, LDSM.T, USETMAXREG)
    and spills (LDL/STL)."""
    counts = {"HMMA": 0, "HMMA.16816.F32.BF16": 0, "LDGSTS": 0, "LDSM": 0, "LDSM.T": 0, "LDL": 0, "STL": 0,
              "MUFU.EX2": 0, "BAR.SYNC": 0, "HGMMA": 0, "UTMALDG": 0, "USETMAXREG": 0}
    for op, n in opcodes(sass_listing(cubin)).items():
        base = op.split(".")[0]
        if base == "HMMA":
            counts["HMMA"] += n
            counts["HMMA.16816.F32.BF16"] += n * op.startswith("HMMA.16816.F32.BF16")
        elif base in ("HGMMA", "UTMALDG", "USETMAXREG"):
            counts[base] += n
        elif base == "LDSM":
            counts["LDSM.T" if ".MT88" in op else "LDSM"] += n
        elif base in ("LDGSTS", "LDL", "STL", "BAR"):
            counts["BAR.SYNC" if base == "BAR" else base] += n
        elif op.startswith("MUFU.EX2"):
            counts["MUFU.EX2"] += n
    return counts
