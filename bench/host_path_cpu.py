"""The Python share of one `Kernel.__call__` on the CPU, no GPU needed: the kernel is lowered (not compiled),
its driver, module and the CUDA-only checks are replaced by stand-ins, and CPU tensors are passed. What is
left is tlc's own host code per launch (checks, plan lookup, struct packing, descriptors); torch's CUDA calls
and cuda-python's cuLaunchKernel are not in it (bench/launch_overhead.py times the whole call on a GPU).

    python3 bench/host_path_cpu.py [--calls 3000]

Prints µs per call (the median of 5 blocks) for a one-tile kernel with TMA descriptors and for the dynamic
persistent one, both d = 128 on sm_90a, each called directly and through `tlc.attention` (same stand-ins); then
specs/decode_fwd.tl (two kernels) called directly and through `tlc.flash_attn_with_kvcache` (B 1, 8/2 heads,
a 256-row cache, d 128).
"""
from __future__ import annotations

import argparse
from pathlib import Path
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from bench import median_block_us  # noqa: E402
from bench.launch_stand_ins import lowered_kernel, no_gpu, record  # noqa: E402
from tlc.attention import kernels, sdpa  # noqa: E402

KERNELS = {"one tile + prefetch": "one_tile", "dynamic persistent": "dynamic"}   # bench/launch_stand_ins.py's


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=3000)
    a = ap.parse_args()
    no_gpu()
    record(setattr, None)   # a driver that accepts launches and keeps nothing
    q, k, v = (torch.randn(1, 1, 128, 128).to(torch.bfloat16) for _ in range(3))
    for name, stand_in in KERNELS.items():
        kernel = lowered_kernel(stand_in)
        kernel(q, k, v)   # plans the geometry
        us = median_block_us(lambda: kernel(q, k, v), a.calls)
        print(f"{name:<22} {us:6.1f} us per Kernel.__call__ (tlc's Python only; B=1 H=1 S=128 d=128, CPU tensors)")
        # the same kernel under tlc.attention: its checks, layout and kernel lookup, or a kept call plan
        sdpa._on_cuda = lambda t: True
        kernels.attention_target = lambda device=None: "sm_90a"
        kernels._ATTENTION.clear()
        sdpa._CALLS.clear()
        kernels.build_attention = lambda *args, kernel=kernel: kernel
        causal = stand_in == "dynamic"
        us = median_block_us(lambda: sdpa.attention(q, k, v, is_causal=causal), a.calls)
        print(f"{'':<22} {us:6.1f} us per tlc.attention call")
    decode(a.calls)
    return 0


def decode(calls: int) -> None:
    """The decode program's two kernels, lowered for sm_90a with the API's tiles, as a ModuleKernel of stand-ins."""
    from tlc.api import compile_module
    from tlc.attention import kvcache
    from tlc.backend_cute.launch_module import ModuleKernel
    from tlc.builder import lower_to_kernel_ir, module_kernel_name
    from bench.launch_stand_ins import stand_in_kernel
    import tlc

    text = (Path(__file__).resolve().parents[1] / "specs" / "decode_fwd.tl").read_text()
    spec, defines = kvcache.kernel_plan(1, 1, 8, 2, 128, 256, "bf16", False)
    defines = {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in defines.items()}
    kernels = []
    for k in ("partial", "combine"):
        state = lower_to_kernel_ir(text.encode(), "decode_fwd.tl", "sm_90a", defines,
                                   name=module_kernel_name("decode_fwd.tl", k), kernel=k)[0]
        kernels.append((k, stand_in_kernel(state.kir, state.abi)))
    program = ModuleKernel(kernels, compile_module(text, "decode_fwd.tl", defines=defines)[0].roles())
    kvcache.spec_kernel = lambda spec, d, device: program
    kvcache._sm_count = lambda device: 132
    q, k = torch.randn(1, 1, 8, 128).to(torch.bfloat16), torch.randn(1, 256, 2, 128).to(torch.bfloat16)
    v, lengths = k.clone(), torch.tensor([200], dtype=torch.int32)
    qk, out = q.view(1, 2, 4, 128), torch.empty(1, 2, 4, 128, dtype=torch.bfloat16)
    direct = lambda: program(qk, k.transpose(1, 2), v.transpose(1, 2), out=out, scale=0.088,  # noqa: E731
                             kv_lengths=lengths)
    api = lambda: tlc.flash_attn_with_kvcache(q, k, v, cache_seqlens=lengths)  # noqa: E731
    for label, fn in (("decode_fwd.tl, 2 kernels", direct), ("", api)):
        fn()
        us = median_block_us(fn, calls)
        print(f"{label:<22} {us:6.1f} us per {'ModuleKernel call' if label else 'flash_attn_with_kvcache call'}")


if __name__ == "__main__":
    sys.exit(main())
