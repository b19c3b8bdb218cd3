"""Host time per `tlc.attention` call on a problem too small to keep the GPU busy (B=1, H=1, S=128):
what a short-sequence row of bench_attention.py pays per launch when the host, not the kernel, is the
bottleneck. Next to SDPA's cuDNN and flash backends in the same run, plus the hottest Python frames
(cProfile) of tlc's call on the default target.

    python3 bench/launch_overhead.py [--calls 300]   # each row: the median of 5 blocks of 300 calls

Each row has two numbers: host, the calls alone (what the CPU spends per call), and wall, with the GPU drained
(higher where the GPU takes longer per call than the host, e.g. a persistent kernel's CTAs on every SM).

Prints a table last; writes $OUT/launch_overhead.json when OUT is set.
"""
from __future__ import annotations

import argparse
import cProfile
import ctypes
import io
import json
import os
import pstats
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

import tlc  # noqa: E402
from tlc.kir.ops_sm90 import TILE_COUNTER  # noqa: E402
from bench import median_block_host_wall_us, require_cuda  # noqa: E402


BLOCKS = 5   # timed blocks of calls per row; the row is their median


def per_call_us(fn, calls: int) -> tuple[float, float]:
    """(host, wall) µs per call, each the median of BLOCKS blocks of `calls` calls: host is the calls alone (the
    launch queue does not fill in one block, so the CPU never waits on the GPU), wall adds the synchronize
    that drains the GPU (above host when the GPU takes longer per call than the host does)."""
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    return median_block_host_wall_us(fn, calls, BLOCKS, torch.cuda.synchronize)


def pieces(q, calls: int) -> dict[str, float]:
    """The CUDA-side calls one planned launch makes (each alone, same timing), to see where the host time goes
    beyond tlc's own Python (bench/host_path_cpu.py times that part on a CPU)."""
    from tlc.attention.sdpa import _CALLS, attention
    attention(q, q, q)
    kernel, plan = _CALLS.recent(next(reversed(_CALLS)))
    dev, idx = plan.device, plan.device.index or 0
    assert TILE_COUNTER not in kernel._filled, "time the pieces on a kernel without a tile counter"
    bound = dict(zip((a.ptr for a in kernel.inputs + kernel.outputs), (q, q, q, torch.empty_like(q))))
    with torch.cuda.device(dev):   # the launch a planned call makes, on these tensors
        params = kernel._struct.from_buffer_copy(kernel._template(plan, bound))
    for ptr, t in bound.items():
        setattr(params, ptr, t.data_ptr())
    stream = torch.cuda.current_stream(dev).cuda_stream
    assert len(bound) == len(kernel.inputs + kernel.outputs) == 4
    libcuda = ctypes.CDLL("libcuda.so.1")
    function, threads, smem = ctypes.c_void_p(int(plan.loaded.function)), kernel.kernel.threads, kernel.kernel.smem_bytes
    arg = (ctypes.c_void_p * 1)(ctypes.addressof(params))

    def direct():   # the same launch through the driver library by ctypes, without cuda-python's wrappers
        if libcuda.cuLaunchKernel(function, *plan.grid, threads, 1, 1, smem, ctypes.c_void_p(stream), arg, None):
            raise RuntimeError("cuLaunchKernel through ctypes failed")

    def in_device():
        with torch.cuda.device(dev):
            pass
    out = {
        "piece: torch.empty (output)": lambda: torch.empty(plan.shapes[0], dtype=plan.dtype, device=dev),
        "piece: torch.zeros(1) (tile counter)": lambda: torch.zeros(1, dtype=torch.int32, device=dev),
        "piece: with torch.cuda.device": in_device,
        "piece: current_stream(dev).cuda_stream": lambda: torch.cuda.current_stream(dev).cuda_stream,
        "piece: _cuda_getCurrentRawStream": lambda: torch._C._cuda_getCurrentRawStream(idx),
        "piece: cuLaunchKernel (cuda-python)": lambda: kernel._fire(plan.loaded, plan.grid, params, stream),
        "piece: cuLaunchKernel (ctypes)": direct,
        "piece: struct from template + 4 ptrs": lambda: [kernel._struct.from_buffer_copy(plan.template)] + [
            q.data_ptr() for _ in range(4)],
    }
    return {name: per_call_us(fn, calls) for name, fn in out.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=300)
    a = ap.parse_args()
    require_cuda("bench/launch_overhead.py")
    q, k, v = (torch.randn(1, 1, 128, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    rows = {}
    for target in ("sm_90a", "sm_90"):
        os.environ["TLC_ATTENTION_ARCH"] = target
        rows[f"tlc.attention ({target})"] = per_call_us(lambda: tlc.attention(q, k, v), a.calls)
        # The layers under tlc.attention: the op's implementation (no torch.library dispatch), the Kernel.
        from tlc.attention.kernels import attention_kernel
        from tlc.attention.sdpa import run_attention
        rows[f"  run_attention ({target})"] = per_call_us(lambda: run_attention(q, k, v, False, None), a.calls)
        kernel = attention_kernel(q, 128, False, k.shape[2])   # the kernel tlc.attention runs for these keys
        rows[f"  Kernel.__call__ ({target})"] = per_call_us(lambda: kernel(q, k, v), a.calls)
        # causal: on sm_90a the short keys' dynamic persistent kernel, whose launch also zeroes a tile counter
        rows[f"tlc.attention causal ({target})"] = per_call_us(lambda: tlc.attention(q, k, v, is_causal=True), a.calls)
    os.environ.pop("TLC_ATTENTION_ARCH")
    rows.update(pieces(q, a.calls))
    for name, backend in (("SDPA cuDNN", SDPBackend.CUDNN_ATTENTION), ("SDPA flash", SDPBackend.FLASH_ATTENTION)):
        with sdpa_kernel(backend):
            rows[name] = per_call_us(lambda: F.scaled_dot_product_attention(q, k, v), a.calls)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(100):
        tlc.attention(q, k, v)
    prof.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(24)
    print(text.getvalue())
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "launch_overhead_profile.txt"), "w") as f:
            f.write(text.getvalue())
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "calls": a.calls, "blocks": BLOCKS,
           "us_per_call": {name: {"host": host, "wall": wall} for name, (host, wall) in rows.items()}}
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "launch_overhead.json"), "w") as f:
            json.dump(out, f, indent=1)
    print(f"µs per call, B=1 H=1 S=128 d=128 bf16, {out['gpu']} (host: the calls alone; wall: with the GPU drained)")
    print(f"{'':<38} {'host':>8} {'wall':>8}")
    for name, (host, wall) in rows.items():
        print(f"{name:<38} {host:8.1f} {wall:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
