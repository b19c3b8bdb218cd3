"""The GPU differential check both spec suites use (test_tl_specs_gpu for sm_90, test_sm90a_specs_gpu
for sm_90a): a case's kernel, built from its TL text, against the TL interpreter of the program as
written (before any pass, so a pass that changed the meaning shows too) in float64 on the CPU, same
bf16 inputs, NaN-poisoned output; and the `--precompile` entry that fills the cache."""
from __future__ import annotations

import math
import sys
from typing import Callable

Source = Callable[[str], tuple[bytes, str, dict[str, str]]]  # case → (TL text, file name, -D bindings)
_BUILT: dict = {}


def built(case: str, source: Source, arch: str):
    """(TL graph as written, kernel) of a case, built once per (case, arch) in this process."""
    import tlc
    from tlc.api import compile_graph

    from tlc.api import compile_module, kernel_names

    if (case, arch) not in _BUILT:
        data, name, defines = source(case)
        if kernel_names(data, name):   # a program of several kernels: the module as written
            graph = compile_module(data, name, defines=defines, run_passes=False)[0]
        else:
            graph, _ = compile_graph(data, name, defines=defines, run_passes=False)
        _BUILT[case, arch] = (graph, tlc.build(data.decode(), arch=arch, defines=defines))
    return _BUILT[case, arch]


def run_case(case: str, source: Source, arch: str, sq: int, sk: int, B: int = 1, H: int = 2,
             Hkv: int | None = None, key_growth: float = 1.0) -> None:
    """Assert the kernel equals the interpreter within 2e-2 · max(1, |ref|), every output row written.
    `key_growth`: K's rows scaled from 1 to this along the keys (scores whose row max keeps moving)."""
    import torch

    from tlc.ir.interpreter import run_program
    from tlc.ir.module import Module, run_module
    graph, kern = built(case, source, arch)
    module = isinstance(graph, Module)
    gen = torch.Generator().manual_seed(sq * 1000 + sk)
    rows = {"seqlen_q": sq, "seqlen_k": sk}
    graphs = graph.graphs if module else (graph,)
    declared = {n: k for g in graphs for n, k in g.inputs.items()}
    scalars = {k: v for k, v in rows.items() if k in declared}
    if "scale" in declared:
        scalars["scale"] = 1.0 / math.sqrt(kern.inputs[0].cols)
    runtime = {}
    for g in graphs:
        runtime.update(tensor_inputs(g, B, H, Hkv or H, rows, gen))
    tensors = {}
    for arg in kern.inputs:
        heads = H if arg.head == "head_idx" else (Hkv or H)
        n = rows.get(arg.rows, int(arg.rows) if arg.rows.isdigit() else 0)
        if arg.rows_at:   # a storage the batch shares, every row no sequence reads NaN
            t = gathered_storage(graphs, arg.name, B, heads, n, arg.cols, dict(scalars, **runtime), gen)
        else:
            t = torch.randn(B, heads, n, *([arg.cols] if arg.cols else []), generator=gen)   # cols 0: a vector
        if arg.name == "K" and key_growth != 1.0:
            t = t * torch.linspace(1.0, key_growth, t.shape[2])[None, None, :, None]
        tensors[arg.name] = t.to(torch.float32 if arg.dtype == "fp32" else torch.bfloat16)
    for g in graphs:
        poison_unseen_rows(g, tensors, dict(scalars, **runtime))
    ref_in = {k: v.double() for k, v in tensors.items()}
    # cols 0: a row vector; a reduce-store's target starts at zero (the launch zeroes it); a workspace as the kernel
    # storing it allocates it
    for arg in (*kern.outputs, *getattr(kern, "workspaces", ())):
        shape = (B, arg.head_count(H, H // (Hkv or H)), rows.get(arg.rows, 0)) + ((arg.cols,) if arg.cols else ())
        ref_in[arg.name] = torch.zeros(shape, dtype=torch.float64) if arg.added else \
            torch.full(shape, float("nan"), dtype=torch.float64)
    ref = (run_module if module else run_program)(graph, ref_in, dict(scalars, **runtime))
    args = [tensors[a.name].cuda() for a in kern.inputs]
    first = kern.outputs[0]
    poisoned = torch.full(ref[first.name].shape, float("nan"), device="cuda",
                          dtype=torch.float32 if first.dtype == "fp32" else torch.bfloat16)
    bound = {a.rows for a in kern.inputs if not a.rows_at}   # the lengths the tensors give (not a storage's)
    extra = {k: v for k, v in scalars.items() if k not in bound and k != "group"}
    extra.update({k: v.cuda() for k, v in runtime.items()})
    nan_memory = torch.full((1 << 24,), float("nan"), device="cuda")
    del nan_memory   # the caching allocator hands the outputs after the first this NaN memory: unwritten shows
    outs = kern(*args, out=poisoned, **extra)
    torch.cuda.synchronize()
    outs = outs if isinstance(outs, tuple) else (outs,)
    for arg, o in zip(kern.outputs, outs):   # every stored tensor (O, and a row vector such as LSE)
        o, r = o.double().cpu(), ref[arg.name]
        finite = torch.isfinite(r)   # not: NaN where the program writes nothing, -inf the LSE of a row without keys
        assert (torch.isnan(o) == torch.isnan(r)).all(), f"{case} {sq}x{sk}: {arg.name}: unwritten or NaN elements"
        assert (o[torch.isinf(r)] == r[torch.isinf(r)]).all() and torch.isfinite(o[finite]).all(), \
            f"{case} {sq}x{sk}: {arg.name}: infinities differ"
        err = (o - r)[finite].abs().max().item() if bool(finite.any()) else 0.0
        bound = 2e-2 * max(1.0, r[finite].abs().max().item() if bool(finite.any()) else 1.0)
        assert err <= bound, f"{case} {sq}x{sk}: {arg.name}: max|kernel - interpreter| = {err:.3e} > {bound:.3e}"


def tensor_inputs(graph, B: int, H: int, Hkv: int, rows: dict, gen) -> dict:
    """Values for the program's tensor Inputs: an int32 tensor with two or more dimensions holds ids that
    run in sorted blocks along its last one (documents: a row sees a contiguous run of keys), a 1-D one
    lengths from 0 to past the longest sequence (0 and more than there is included); fp32 ones are normal."""
    import torch

    from tlc.ir.ops import AllocateOp
    from tlc.ir.tensor_inputs import launch_sizes, loads, tensor_shape
    sizes = dict(rows, **launch_sizes(B, H, Hkv), **{k: v for k, v in graph.params.items()
                                                     if isinstance(v, int) and not isinstance(v, bool)})
    longest = max(rows.values())
    tables = {x.base.name for _, op in graph.walk() if isinstance(op, AllocateOp) and op.rows_at is not None
              for x in loads(op.rows_at)}
    out = {}
    for name, t in graph.tensor_inputs.items():
        shape = tensor_shape(t.dims, sizes)
        if t.kind == "float":
            out[name] = torch.randn(shape, generator=gen)
        elif name in tables:   # a row map's table (pages): distinct entries, scattered
            out[name] = torch.randperm(max(math.prod(shape), 1), generator=gen)[:math.prod(shape)].view(
                shape).to(torch.int32)
        elif len(shape) >= 2:
            out[name] = torch.sort(torch.randint(0, 4, shape, generator=gen), dim=-1).values.to(torch.int32)
        else:
            x = torch.randint(0, longest + 3, shape, generator=gen)
            if x.numel() >= 2:
                x[0], x[-1] = 0, longest + 2
            out[name] = x.to(torch.int32)
    return out


def gathered_storage(graphs, name: str, B: int, heads: int, rows: int, cols: int, env: dict, gen):
    """The storage of a tensor read through a row map (`rows at …`, tlc/ir/row_maps.py): (1, heads, R, cols),
    R one past the last row any sequence's rows map to, and 16 more; random where a row the program sees reads,
    NaN everywhere else (other sequences' past their lengths, unused pages): a kernel reading one shows it."""
    import torch

    from tlc.expr import eval_expr
    from tlc.ir.ops import AllocateOp
    from tlc.ir.row_maps import rows_read

    op = next(op for g in graphs for _, op in g.walk()
              if isinstance(op, AllocateOp) and op.name == name and op.rows_at is not None)
    env = dict(env, **{k: v for g in graphs for k, v in g.params.items() if isinstance(v, int)})
    read = [rows_read(op.rows_at, min(rows, max(0, int(eval_expr(op.shape[0], dict(env, batch_idx=b))))),
                      dict(env, batch_idx=b)) for b in range(B)]
    used = torch.cat(read) if read else torch.zeros(0, dtype=torch.int64)
    total = int(used.max()) + 1 + 16 if used.numel() else 16
    t = torch.full((1, heads, total, cols), float("nan"))
    keep = used[(used >= 0) & (used < total)]
    t[0, :, keep] = torch.randn(heads, len(keep), cols, generator=gen)
    return t


def poison_unseen_rows(graph, tensors: dict, env: dict) -> None:
    """NaN in the rows a tensor holds but the program does not see (`Allocate K in global
    (min(kv_lengths[batch_idx], seqlen_k), …)`): a kernel that reads one shows it in its output."""
    from tlc.expr import eval_expr
    from tlc.ir.ops import AllocateOp
    from tlc.ir.tensor_inputs import loads

    for _, op in graph.walk():
        if isinstance(op, AllocateOp) and op.space == "global" and op.shape and loads(op.shape[0]) \
                and op.name in tensors and op.rows_at is None:   # a row map's storage: NaN where unread already
            t = tensors[op.name]
            for b in range(t.shape[0]):
                seen = max(0, int(eval_expr(op.shape[0], dict(env, batch_idx=b))))
                t[b, :, seen:] = float("nan")


def _precompile(args: tuple[str, Source, str]) -> str:
    case, source, arch = args
    import tlc
    data, _, defines = source(case)
    try:
        tlc.build(data.decode(), arch=arch, defines=defines)
    except Exception as exc:  # noqa: BLE001 - report and continue
        return f"{case}: ERROR {exc}"
    return f"{case}: ok"


def precompile_main(cases, source: Source, arch: str) -> None:
    """`python tests/gpu/<suite>.py --precompile [--jobs N]`: build every case in parallel, then exit."""
    from concurrent.futures import ProcessPoolExecutor

    jobs = int(sys.argv[sys.argv.index("--jobs") + 1]) if "--jobs" in sys.argv else 4
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        for line in pool.map(_precompile, [(case, source, arch) for case in cases]):
            print(line, flush=True)
    raise SystemExit(0)
