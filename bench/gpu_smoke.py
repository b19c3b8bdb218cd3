"""One-call GPU check: correctness (DESIGN §8 rule, NaN-poisoned outputs) over configs × sizes,
SASS instruction check (cuobjdump), registers/spills, and a quick timing. Prints a table last.

    python bench/gpu_smoke.py [--quick]
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from bench.precompile import test_configs  # noqa: E402
from tlc.backend_cute.attention import attention_kernel  # noqa: E402
from tlc.testing_tolerance import check_attention  # noqa: E402

SIZES = [(2, 4, 2, 1, 1), (2, 4, 2, 17, 17), (2, 4, 4, 128, 128), (1, 4, 1, 1000, 1000), (2, 2, 2, 1024, 1024),
         (1, 2, 2, 4096, 4096), (2, 4, 2, 17, 1000), (2, 4, 2, 1000, 17), (1, 2, 1, 300, 4096)]


def sass_summary(cubin: bytes) -> dict:
    """Counts of the instructions the recipe needs (HMMA, LDGSTS, LDSM, LDSM.T) and spills (LDL/STL)."""
    import re
    exe = shutil.which("cuobjdump") or "/usr/local/cuda/bin/cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    out = subprocess.run([exe, "-sass", f.name], capture_output=True, text=True).stdout
    os.unlink(f.name)
    counts = {"HMMA": 0, "HMMA.16816.F32.BF16": 0, "LDGSTS": 0, "LDSM": 0, "LDSM.T": 0, "LDL": 0, "STL": 0,
              "MUFU.EX2": 0, "BAR.SYNC": 0}
    for line in out.splitlines():
        m = re.search(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line)
        if not m:
            continue
        op = m.group(1)
        base = op.split(".")[0]
        if base == "HMMA":
            counts["HMMA"] += 1
            counts["HMMA.16816.F32.BF16"] += op.startswith("HMMA.16816.F32.BF16")
        elif base == "LDSM":
            counts["LDSM.T" if ".MT88" in op else "LDSM"] += 1
        elif base in ("LDGSTS", "LDL", "STL", "BAR"):
            counts["BAR.SYNC" if base == "BAR" else base] += 1
        elif op.startswith("MUFU.EX2"):
            counts["MUFU.EX2"] += 1
    return counts


def main() -> int:
    quick = "--quick" in sys.argv
    torch.manual_seed(0)
    fails = 0
    results = {"correctness": [], "sass": {}, "timing": []}
    for cfg in test_configs():
        kern = attention_kernel(cfg, "sm_90")
        attrs = kern.attributes(0)
        sass = sass_summary(kern.compiled.cubin)
        results["sass"][cfg.key()] = dict(sass, **attrs)
        dt = torch.bfloat16 if cfg.dtype == "bf16" else torch.float16
        for (B, Hq, Hkv, Sq, Sk) in (SIZES[:5] if quick else SIZES):
            q = torch.randn(B, Hq, Sq, cfg.d_qk, device="cuda", dtype=dt)
            k = torch.randn(B, Hkv, Sk, cfg.d_qk, device="cuda", dtype=dt)
            v = torch.randn(B, Hkv, Sk, cfg.d_v, device="cuda", dtype=dt)
            out = torch.full((B, Hq, Sq, cfg.d_v), float("nan"), device="cuda", dtype=dt)
            kw = dict(softcap=30.0) if cfg.softcap else {}
            if cfg.lse:
                o, lse = kern(q, k, v, out=out, return_lse=True)
            else:
                o = kern(q, k, v, out=out, **kw)
            torch.cuda.synchronize()
            rep = check_attention(o, q, k, v, causal=cfg.causal, alignment=cfg.alignment,
                                  softcap=kw.get("softcap"))
            extra = ""
            if cfg.lse:
                from tlc.testing_tolerance import attention_reference
                _, lse_ref = attention_reference(q, k, v, causal=cfg.causal, alignment=cfg.alignment, return_lse=True)
                fin = torch.isfinite(lse_ref)
                lse_err = (lse[fin] - lse_ref[fin]).abs().max().item() if fin.any() else 0.0
                same_inf = bool((torch.isfinite(lse) == fin).all().item())
                extra = f" lse_err={lse_err:.2e} inf_match={same_inf}"
                if lse_err > 1e-3 or not same_inf:
                    rep.passed = False
            fails += not rep.passed
            line = f"{'PASS' if rep.passed else 'FAIL'} {cfg.key():58s} B{B} H{Hq}/{Hkv} {Sq}x{Sk}: {rep}{extra}"
            print(line, flush=True)
            results["correctness"].append(line)
    out_dir = os.environ.get("OUT", "/tmp")
    with open(os.path.join(out_dir, "smoke.json"), "w") as f:
        json.dump(results, f, indent=1)
    print("\nSASS / resources:")
    for key, s in results["sass"].items():
        print(f"  {key:58s} {json.dumps(s)}")
    print(f"\ncorrectness: {len(results['correctness']) - fails} passed, {fails} failed")
    return 1 if fails else 0


if __name__ == "__main__":
    raise SystemExit(main())
