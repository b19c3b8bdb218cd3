"""Decode against a KV cache (one new token, bf16, d = 128): tlc's kernels built from the decode specs against
torch SDPA's cuDNN and flash (FA2) backends, in the same run on the same GPU. Memory-bound: reported as TB/s
of K and V read once (B · kv heads · cache · d · 2 tensors · 2 bytes).

    python bench/bench_kv_decode.py [--arch sm_90a]     # table last, JSON under $OUT

tlc rows, all with the query heads that share a KV head folded into the block's rows (Q (B, H, 1, d) viewed
as (B, kv heads, group, d): one K/V read serves the group; a view, no copy):
  kv_lengths   specs/kv_lengths_fwd.tl (each sequence's length from a tensor; one block per (batch, kv head))
  split S      specs/split_kv_fwd.tl with Splits = S (partial O/LSE per split in fp32, then the combine kernel)
  paged P      specs/paged_kv_fwd.tl with pages of P rows (the cache a pool of pages scattered by a block table)
  api, api paged 64   tlc.flash_attn_with_kvcache in FlashAttention's layouts (its split heuristic; a paged cache)
  … graph      the same call (and cuDNN's) captured in a CUDA graph and replayed, as a serving loop runs decode
               steps: the kernels' time without the host's per-call work
Each output is checked with docs/correctness.md's rule on a slice (batch 0, the first 4 heads).
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SPECS = Path(__file__).resolve().parents[1] / "specs"
SHAPES = [dict(B=8, H=32, KVH=8, S=8192), dict(B=64, H=32, KVH=8, S=4096), dict(B=1, H=128, KVH=1, S=32768)]
D = 128
TILES = {"HeadDim": str(D), "BM": "64", "BN": "128"}
KERNELS = {   # label → (spec, -D bindings)
    "kv_lengths": ("kv_lengths_fwd", TILES),
    **{f"split {s}": ("split_kv_fwd", dict(TILES, Splits=str(s))) for s in (4, 16, 64)},
    "paged 16": ("paged_kv_fwd", dict(TILES, PageSize="16")),
    "paged 64": ("paged_kv_fwd", dict(TILES, PageSize="64")),
}


def _build(args: tuple[str, str, dict]) -> str:
    spec, arch, defines = args
    import tlc
    tlc.build(SPECS / f"{spec}.tl", arch=arch, defines=defines)
    return spec


def bench_ms(fn) -> float:
    from triton.testing import do_bench
    return do_bench(fn, warmup=25, rep=200, return_mode="median")


def pools_of(k, v, page: int):
    """(1, kv heads, pages · page, d) pools holding k and v (B, kv heads, S, d) in pages scattered by one random
    permutation, and the (B, S / page) block table."""
    import torch
    B, H, S, d = k.shape
    per = S // page
    table = torch.randperm(B * per, device=k.device).view(B, per).to(torch.int32)
    pools = []
    for t in (k, v):
        pool = torch.empty(1, H, B * per * page, d, device=t.device, dtype=t.dtype)
        pool.view(H, B * per, page, d)[:, table.view(-1).long()] = t.view(B, H, per, page, d).permute(
            1, 0, 2, 3, 4).reshape(H, B * per, page, d)
        pools.append(pool)
    return pools[0], pools[1], table


def graphed(fn):
    """`fn` captured in a CUDA graph (how a serving loop runs decode steps: no host work per step), on the first
    call after a warm-up one; every call replays the graph and returns the captured output."""
    import torch
    kept: dict = {}

    def call():
        if not kept:
            fn()
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                kept["out"] = fn()
            kept["graph"] = graph
        kept["graph"].replay()
        return kept["out"]
    return call


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="sm_90a")
    arch = ap.parse_args().arch
    from bench import require_cuda
    require_cuda("bench_kv_decode.py")
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import tlc
    from tlc.testing_tolerance import check_attention

    with ProcessPoolExecutor(min(len(KERNELS), os.cpu_count() or 1)) as pool:   # NVRTC in parallel, to the cache
        list(pool.map(_build, [(s, arch, d) for s, d in KERNELS.values()]))
    kerns = {label: tlc.build(SPECS / f"{s}.tl", arch=arch, defines=d) for label, (s, d) in KERNELS.items()}
    dev = torch.cuda.get_device_name()
    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "gpu": dev,
              "torch": torch.__version__, "arch": arch, "kernels": {k: list(v) for k, v in KERNELS.items()},
              "rows": []}
    for shape in SHAPES:
        B, H, KVH, S = shape["B"], shape["H"], shape["KVH"], shape["S"]
        G, scale = H // KVH, D ** -0.5
        q = torch.randn(B, H, 1, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(B, KVH, S, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(B, KVH, S, D, device="cuda", dtype=torch.bfloat16)
        gbytes = 2 * B * KVH * S * D * 2 / 1e9
        lengths = torch.full((B,), S, device="cuda", dtype=torch.int32)
        qg = q.view(B, KVH, G, D)   # the group's heads as rows
        ref_k, ref_v = (t[:1].repeat_interleave(G, dim=1)[:, :4] for t in (k, v))
        row = dict(shape, cells={})

        def record(label: str, fn, out=None) -> None:
            try:
                o = fn()
                torch.cuda.synchronize()
                o = o[0] if isinstance(o, tuple) else o
                o = o.reshape(B, H, 1, D)
                rep = check_attention(o[:1, :4], q[:1, :4], ref_k, ref_v, scale=scale)
                ms = bench_ms(fn)
                row["cells"][label] = dict(ms=ms, tbps=gbytes / ms, passed=rep.passed, check=str(rep))
            except Exception as exc:  # noqa: BLE001 - a peer without this shape: say so in the table
                row["cells"][label] = dict(error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}")

        for backend, name in ((SDPBackend.CUDNN_ATTENTION, "cuDNN"), (SDPBackend.FLASH_ATTENTION, "SDPA FA2")):
            def peer(backend=backend):
                with sdpa_kernel([backend]):
                    return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)
            record(name, peer)
            if name == "cuDNN":
                record("cuDNN graph", graphed(peer))
        out = torch.empty(B, KVH, G, D, device="cuda", dtype=torch.bfloat16)
        record("kv_lengths", lambda: kerns["kv_lengths"](qg, k, v, out=out, scale=scale, kv_lengths=lengths))
        for s in (4, 16, 64):
            kern = kerns[f"split {s}"]
            record(f"split {s}", lambda kern=kern: kern(qg, k, v, scale=scale))
        for page in (16, 64):
            if S % page:
                continue
            kp, vp, table = pools_of(k, v, page)
            kern = kerns[f"paged {page}"]
            record(f"paged {page}", lambda kern=kern, kp=kp, vp=vp, table=table: kern(
                qg, kp, vp, out=out, scale=scale, seqlen_k=S, kv_lengths=lengths, block_table=table))
            del kp, vp
        # the serving API in FlashAttention's layouts: (B, 1, H, d) queries, (B, S, kv heads, d) or paged caches
        q_fa = q.transpose(1, 2).contiguous()
        k_fa, v_fa = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
        api = lambda: tlc.flash_attn_with_kvcache(q_fa, k_fa, v_fa, cache_seqlens=lengths).transpose(1, 2)  # noqa: E731
        record("api", api)
        record("api graph", graphed(api))
        kp, vp, table = pools_of(k, v, 64)
        pages = lambda t: t[0].view(KVH, -1, 64, D).permute(1, 2, 0, 3).contiguous()  # noqa: E731 - (pages, 64, kvh, d)
        kp, vp = pages(kp), pages(vp)
        paged_api = lambda: tlc.flash_attn_with_kvcache(q_fa, kp, vp, cache_seqlens=lengths,  # noqa: E731
                                                        block_table=table).transpose(1, 2)
        record("api paged 64", paged_api)
        record("api paged 64 graph", graphed(paged_api))
        del q_fa, k_fa, v_fa, kp, vp
        report["rows"].append(row)
        torch.cuda.empty_cache()
    out_dir = os.environ.get("OUT") or "."
    with open(os.path.join(out_dir, f"bench_kv_decode_{arch}.json"), "w") as f:
        json.dump(report, f, indent=1, default=str)
    labels = list(report["rows"][0]["cells"])
    print(f"\n{dev}, torch {torch.__version__}, tlc {arch}: decode, one new token, bf16, d = {D}; TB/s of K and V "
          "read (median of do_bench); * = failed the tolerance check")
    print(f"{'B x H/KVH x cache':22s}" + "".join(f"{k:>14s}" for k in labels))
    ok = True
    for r in report["rows"]:
        cells = []
        for k in labels:
            c = r["cells"].get(k, {})
            if "tbps" in c:
                cells.append(f"{c['tbps']:13.2f}{'' if c['passed'] else '*'}")
                ok &= c["passed"]
            else:
                cells.append(f"{'—':>14s}")
        print(f"{r['B']:>3d} x {r['H']}/{r['KVH']} x {r['S']:<8d}" + "".join(cells))
    for r in report["rows"]:
        for k, c in r["cells"].items():
            if "error" in c:
                print(f"  {r['B']}x{r['H']}/{r['KVH']}x{r['S']} {k}: {c['error']}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
