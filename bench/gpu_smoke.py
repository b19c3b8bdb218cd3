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
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from bench.precompile import test_configs  # noqa: E402
from tlc.backend_cute.attention import attention_kernel  # noqa: E402
from tlc.testing_tolerance import check_attention  # noqa: E402

SIZES = [(2, 4, 2, 1, 1), (2, 4, 2, 17, 17), (2, 4, 4, 128, 128), (1, 4, 1, 1000, 1000), (2, 2, 2, 1024, 1024),
         (1, 2, 2, 4096, 4096), (2, 4, 2, 17, 1000), (2, 4, 2, 1000, 17), (1, 2, 1, 300, 4096)]


def sass_summary(cubin: bytes) -> dict:
    exe = shutil.which("cuobjdump") or "/usr/local/cuda/bin/cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    out = subprocess.run([exe, "-sass", f.name], capture_output=True, text=True).stdout
    os.unlink(f.name)
    counts = {}
    for op in ("HMMA.16816.F32.BF16", "HMMA.16816.F32", "LDGSTS", "LDSM.16.M88.4", "LDSM.16.MT88.4", "LDL", "STL",
               "MUFU.EX2", "BAR.SYNC"):
        counts[op] = sum(1 for line in out.splitlines() if f" {op}" in line and (op != "LDL" or "LDL." in line or " LDL " in line))
    return counts


def main() -> int:
    quick = "--quick" in sys.argv
    torch.manual_seed(0)
    rows, fails = [], 0
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
