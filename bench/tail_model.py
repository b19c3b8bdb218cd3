"""How evenly a causal grid's order ends, in a model (no GPU): the hardware hands out CTAs in launch order,
each to the SM that frees first (list scheduling over 132 SMs, one CTA each); a tile costs its ring trips + 1
(the prologue and epilogue). The tiles' trips and order come from the kernel IR `tlc.attention` builds on
sm_90a — the hardware's x-fastest order, `l2-sections` and `L2TailOnly` (tlc/kir/transforms/attention/l2_sections.py) —
evaluated as the CUDA code computes them. Prints each bar causal grid's makespan over an even spread:

    python3 bench/tail_model.py

A model, not a timing: the H200 A/B (bench/results/2026-11-27-h200-s13-l2-sections-ab.txt) found the
sections' L2 cost larger than their tail gain except at d = 256.
"""
from __future__ import annotations

import heapq
import math
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tlc.api import compile_graph  # noqa: E402
from tlc.kir import ops as K  # noqa: E402
from tlc.kir import ops_sm90 as H  # noqa: E402
from tlc.kir.evaluate import evaluate  # noqa: E402
from tlc.kir.expr import Const, free_names  # noqa: E402
from tlc.kir.transforms.warp_specialize import is_ring_loop  # noqa: E402
from tlc.lowering.passes import run_lowering  # noqa: E402

SPECS = Path(__file__).resolve().parents[1] / "specs"
SMS = 132   # an H100 / H200
# The bar's causal rows (bench/bench_attention.py BAR_ROWS) with their sm_90a tiles: (name, S, heads, batch, -D)
GRIDS = [("MHA d=64 causal", 4096, 32, 4, dict(HeadDim="64", BM="192", BN="128", Warps="12", Causal="true")),
         ("MHA d=128 causal", 4096, 16, 4, dict(HeadDim="128", BM="128", BN="128", Warps="8", Causal="true")),
         ("MHA d=256 causal", 4096, 8, 4, dict(HeadDim="256", BM="128", BN="64", Warps="8", Causal="true")),
         ("GQA/MQA 32 heads d=128 causal", 4096, 32, 4, dict(HeadDim="128", BM="128", BN="128", Warps="8",
                                                             Causal="true")),
         ("MHA d=128 S=1k causal", 1024, 16, 16, dict(HeadDim="128", BM="128", BN="128", Warps="8", Causal="true"))]
ORDERS = {"x fastest": {}, "l2-sections": {"L2Sections": "true"},
          "L2TailOnly": {"L2Sections": "true", "L2TailOnly": "true"}}


def lower_state(spec: str = "gqa_fwd", **defines: str):
    """The sm_90a lowering state (kernel IR, schedule notes) of a shipped spec with these -D bindings."""
    path = SPECS / f"{spec}.tl"
    graph, _ = compile_graph(path.read_bytes(), str(path), defines=defines)
    return run_lowering(graph, "sm_90a", name=spec)[0]


def lower(spec: str = "gqa_fwd", **defines: str):
    """The sm_90a kernel of a shipped spec with these -D bindings."""
    return lower_state(spec, **defines).kir.kernels()[0]


def decode(kernel, env: dict, tile: int) -> dict:
    """The l2-sections decode's values (`l2_*` Lets) for hardware block number `tile`."""
    env = dict(env, **{"blockIdx.x": tile})
    for op in kernel.body:
        if isinstance(op, K.LetOp) and op.name.startswith("l2_"):
            env[op.name] = evaluate(op.value, env)
    return env


def ring(kernel) -> K.ForOp:
    """The producer's K/V ring loop."""
    (roles,) = [op for op in kernel.body if isinstance(op, H.WarpSpecializeOp)]
    (loop,) = [y for op in roles.producer for y in K.walk(op) if is_ring_loop(y)]
    return loop


def trips(kernel, env: dict, tile: int) -> int:
    """The ring trips of hardware block `tile`: the decode (if any), the kernel's Lets, the loop's stop."""
    env = decode(kernel, env, tile)
    for op in kernel.body:
        if isinstance(op, K.LetOp) and not op.name.startswith("l2_") and free_names(op.value) <= env.keys():
            env[op.name] = evaluate(op.value, env)
    return evaluate(ring(kernel).stop, env)


def makespan(costs: list[int], sms: int = SMS) -> float:
    """In-order dispatch, each CTA to the SM that frees first: when the last one ends."""
    free = [0.0] * sms
    for c in costs:
        heapq.heappush(free, heapq.heappop(free) + c)
    return max(free)


def over_even(kernel, sq: int, heads: int, batch: int, bm: int) -> float:
    """The grid's makespan over an even spread of its work, blocks in launch order (x fastest on a 3-D grid)."""
    env = {"p.seqlen_q": sq, "p.seqlen_k": sq, "p.heads": heads, "p.batch": batch, "p.group": 1,
           "blockIdx.y": 0, "blockIdx.z": 0}
    gx = math.ceil(sq / bm)
    if kernel.grid[1] == Const(1) and kernel.grid[2] == Const(1):   # l2-sections: one axis, the decode's order
        costs = [trips(kernel, env, t) + 1 for t in range(gx * heads * batch)]
    else:   # the hardware's order: every head's query tiles in turn (the trips do not depend on the head)
        costs = [trips(kernel, env, x) + 1 for _ in range(heads * batch) for x in range(gx)]
    return makespan(costs) / (sum(costs) / SMS)


def main() -> int:
    print(f"makespan over an even spread, {SMS} SMs, tile cost = ring trips + 1")
    print(f"{'grid':32s}" + "".join(f"{o:>14s}" for o in ORDERS))
    for name, sq, heads, batch, defines in GRIDS:
        ratios = [over_even(lower(**defines, **extra), sq, heads, batch, int(defines["BM"]))
                  for extra in ORDERS.values()]
        print(f"{name:32s}" + "".join(f"{r:14.3f}" for r in ratios))
    return 0


if __name__ == "__main__":
    sys.exit(main())
