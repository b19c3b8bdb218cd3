"""SASS instruction counts of a cubin (cuobjdump): the instructions a kernel was meant to use, and spills."""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile


def sass_summary(cubin: bytes) -> dict:
    """Counts of the instructions the recipe needs (HMMA or HGMMA, LDGSTS or UTMALDG, LDSM, LDSM.T, USETMAXREG)
    and spills (LDL/STL)."""
    import re
    exe = shutil.which("cuobjdump") or "/usr/local/cuda/bin/cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    out = subprocess.run([exe, "-sass", f.name], capture_output=True, text=True).stdout
    os.unlink(f.name)
    counts = {"HMMA": 0, "HMMA.16816.F32.BF16": 0, "LDGSTS": 0, "LDSM": 0, "LDSM.T": 0, "LDL": 0, "STL": 0,
              "MUFU.EX2": 0, "BAR.SYNC": 0, "HGMMA": 0, "UTMALDG": 0, "USETMAXREG": 0}
    for line in out.splitlines():
        m = re.search(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line)
        if not m:
            continue
        op = m.group(1)
        base = op.split(".")[0]
        if base == "HMMA":
            counts["HMMA"] += 1
            counts["HMMA.16816.F32.BF16"] += op.startswith("HMMA.16816.F32.BF16")
        elif base in ("HGMMA", "UTMALDG", "USETMAXREG"):
            counts[base] += 1
        elif base == "LDSM":
            counts["LDSM.T" if ".MT88" in op else "LDSM"] += 1
        elif base in ("LDGSTS", "LDL", "STL", "BAR"):
            counts["BAR.SYNC" if base == "BAR" else base] += 1
        elif op.startswith("MUFU.EX2"):
            counts["MUFU.EX2"] += 1
    return counts
