"""tlc.flash_attn_with_kvcache on the CPU: its split heuristic, its one-line refusals naming the argument, the
pool view of a paged cache, and a paged call through the real launcher (a stand-in driver): the struct the
kernel gets — one new token folds the group's heads into the rows, the cache's capacity is seqlen_k, the pool's
rows the storage rows. The kernels' results are checked on a GPU (tests/gpu/test_kvcache_gpu.py)."""
from __future__ import annotations

import ctypes
import re

import pytest
import torch

import tlc
from tlc.attention import kvcache, sdpa
from tlc.attention.kernels import specs_dir
from tlc.attention.kvcache import num_splits_heuristic
from tlc.diagnostics import TlcError


@pytest.mark.parametrize("blocks, tiles, want", [(64, 64, 2), (512, 32, 1), (2, 256, 64), (16, 8, 8), (1, 1, 1),
                                                  (100, 64, 8), (8, 3, 2)])
def test_the_split_heuristic_fills_the_last_wave(blocks: int, tiles: int, want: int) -> None:
    assert num_splits_heuristic(blocks, 132, tiles) == want


@pytest.mark.parametrize("batch, heads, kv_heads, cache_rows, splits", [(8, 32, 8, 8192, 4), (64, 32, 8, 4096, 1),
                                                                         (1, 128, 1, 32768, 64)])
def test_the_plan_counts_two_partial_ctas_per_sm_at_d128(batch, heads, kv_heads, cache_rows, splits) -> None:
    """bench_kv_decode's shapes on an H200: 64-key tiles, two partial CTAs per SM, the combine on 16-row blocks."""
    assert kvcache.resident_ctas(128, 64, 64) == 2 and kvcache.resident_ctas(256, 64, 64) == 1
    spec, defines = kvcache.kernel_plan(batch, 1, heads, kv_heads, 128, cache_rows, "bf16", False, sms=132)
    assert spec == "decode_fwd"
    assert defines == {"HeadDim": 128, "BM": 64, "BN": 64, "CM": 16, "dtype": "bf16", "Causal": False,
                       "Splits": splits}


def cache(b=2, sk=64, kvh=2, d=64, dtype=torch.bfloat16):
    return torch.zeros(b, sk, kvh, d, dtype=dtype), torch.zeros(b, sk, kvh, d, dtype=dtype)


@pytest.fixture
def on_cuda(monkeypatch):
    monkeypatch.setattr(sdpa, "_on_cuda", lambda t: True)


@pytest.mark.parametrize("change, message", [
    (dict(q=torch.zeros(2, 1, 4, 64)), "q is torch.float32; q, k_cache and v_cache are all bf16 or all fp16"),
    (dict(v_cache=None), "v_cache=None (MLA's latent cache read for K and V) is not supported yet"),
    (dict(q=torch.zeros(2, 4, 64, dtype=torch.bfloat16)), "q must be 4-D (batch, rows, heads, d), got shape (2, 4, 64)"),
    (dict(q=torch.zeros(2, 1, 3, 64, dtype=torch.bfloat16)), "q's 3 heads are not a multiple of the cache's 2 KV"),
    (dict(q=torch.zeros(3, 1, 4, 64, dtype=torch.bfloat16)), "k_cache holds 2 sequences, q 3"),
    (dict(cache_seqlens=65), "cache_seqlens = 65 is outside the cache's 0 … 64 rows"),
    (dict(cache_seqlens=torch.zeros(2, dtype=torch.int64)), "cache_seqlens must be an int32 tensor of \\(2,\\)"),
    (dict(cache_seqlens=1.5), "cache_seqlens must be an int or an int32 tensor of \\(batch,\\), not a float"),
    (dict(num_splits=3), "num_splits must be 0 (the heuristic) or one of (1, 2, 4, 8, 16, 32, 64), not 3"),
    (dict(causal="yes"), "causal must be True or False"),
    (dict(block_table=torch.zeros(2, 4, dtype=torch.int64)), "block_table must be an int32 tensor of \\(batch = 2"),
    (dict(block_table=torch.zeros(2, 4, dtype=torch.int32), k_cache=torch.zeros(8, 8, 2, 64, dtype=torch.bfloat16),
          v_cache=torch.zeros(8, 8, 2, 64, dtype=torch.bfloat16)), "page size 8 is not supported"),
])
def test_a_bad_argument_is_refused_in_one_line_naming_it(on_cuda, change: dict, message: str) -> None:
    k, v = cache()
    args = dict(q=torch.zeros(2, 1, 4, 64, dtype=torch.bfloat16), k_cache=k, v_cache=v)
    args.update(change)
    with pytest.raises(TlcError, match=message if "\\" in message else re.escape(message)) as info:
        tlc.flash_attn_with_kvcache(**args)
    assert "\n" not in str(info.value).strip()


def test_cpu_tensors_are_refused() -> None:
    k, v = cache()
    with pytest.raises(TlcError, match="q is on cpu; move it to a CUDA device"):
        tlc.flash_attn_with_kvcache(torch.zeros(2, 1, 4, 64, dtype=torch.bfloat16), k, v)


def test_the_pool_is_a_view_of_the_paged_cache() -> None:
    pages = torch.randn(5, 16, 3, 8)
    pool = kvcache._pool(pages)
    assert pool.shape == (1, 3, 80, 8) and pool.data_ptr() == pages.data_ptr()
    assert torch.equal(pool[0, 2, 3 * 16 + 7], pages[3, 7, 2])


def test_a_paged_call_binds_the_pool_the_table_and_the_heads_as_rows(on_cuda, monkeypatch) -> None:
    from bench.launch_stand_ins import no_gpu, record, stand_in_kernel
    from tlc.api import compile_graph
    from tlc.lowering.passes import run_lowering

    no_gpu(monkeypatch.setattr)
    defines = {"HeadDim": 64, "BM": 64, "BN": 128, "dtype": "bf16", "Causal": False, "PageSize": 16}
    graph, _ = compile_graph((specs_dir() / "paged_kv_fwd.tl").read_text(), "paged_kv_fwd.tl",
                             defines={k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in defines.items()})
    state, _ = run_lowering(graph, "sm_90a", name="paged_kv_fwd")
    kernel = stand_in_kernel(state.kir, state.abi)   # the one-kernel paged program: its struct is the same
    monkeypatch.setattr(kvcache, "_sm_count", lambda device: 132)
    asked = []
    monkeypatch.setattr(kvcache, "spec_kernel", lambda spec, d, device: asked.append((spec, d)) or kernel)
    driver = record(monkeypatch.setattr, ctypes.sizeof(kernel._struct))
    q = torch.randn(3, 1, 8, 64).to(torch.bfloat16)
    pages = torch.randn(12, 16, 2, 64).to(torch.bfloat16)
    table = torch.arange(12, dtype=torch.int32).view(3, 4)
    lengths = torch.tensor([0, 17, 64], dtype=torch.int32)
    out = tlc.flash_attn_with_kvcache(q, pages, pages.clone(), cache_seqlens=lengths, block_table=table)
    assert tuple(out.shape) == (3, 1, 8, 64)
    # 64 rows of cache are one key tile of 128: nothing to split
    assert asked == [("paged_decode_fwd", dict(defines, BN=64, CM=16, Splits=1))]
    struct = kernel._struct.from_buffer_copy(driver.launches[-1][-1])
    # the 4 query heads of each KV head are the rows: 2 heads of 4 rows, group 1; the cache holds 4 pages of 16
    assert (struct.heads, struct.group, struct.seqlen_q, struct.seqlen_k, struct.K_storage_rows, struct.batch) == \
        (2, 1, 4, 64, 192, 3)
    assert (struct.kv_lengths_ptr, struct.block_table_ptr) == (lengths.data_ptr(), table.data_ptr())
    assert struct.O_ptr == out.data_ptr()
    # the same geometry again: no check, no plan, no kernel lookup; the new call's tensors in the struct
    checked, check = [], kvcache._check
    monkeypatch.setattr(kvcache, "_check", lambda *a: checked.append(a) or check(*a))
    q2, lengths2, table2 = q.clone(), torch.tensor([5, 0, 33], dtype=torch.int32), table.flip(0).contiguous()
    out2 = tlc.flash_attn_with_kvcache(q2, pages, pages.clone(), cache_seqlens=lengths2, block_table=table2)
    assert len(asked) == 1 and len(driver.launches) == 2 and not checked
    again = kernel._struct.from_buffer_copy(driver.launches[-1][-1])
    assert (again.kv_lengths_ptr, again.block_table_ptr, again.O_ptr) == (lengths2.data_ptr(), table2.data_ptr(),
                                                                          out2.data_ptr())
    assert (again.heads, again.group, again.seqlen_q, again.seqlen_k, again.K_storage_rows) == (2, 1, 4, 64, 192)
    # an int length is part of the geometry: another value is checked (and refused here: past the cache)
    with pytest.raises(TlcError, match="outside the cache"):
        tlc.flash_attn_with_kvcache(q2, pages, pages.clone(), cache_seqlens=65, block_table=table2)


# ------------------------------------------------------------------ torch.compile sees one op
def test_torch_compile_fullgraph_traces_one_kvcache_op_per_call() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    graphs = []

    def recording(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def step(q, k, v, lengths, table):
        return tlc.flash_attn_with_kvcache(q, k, v, cache_seqlens=lengths, block_table=table) + 1

    mode = FakeTensorMode()
    with mode:
        q = torch.empty(3, 1, 8, 64, dtype=torch.bfloat16, device="cuda")
        pages = torch.empty(12, 16, 2, 64, dtype=torch.bfloat16, device="cuda")
        lengths = torch.empty(3, dtype=torch.int32, device="cuda")
        table = torch.empty(3, 4, dtype=torch.int32, device="cuda")
    torch._dynamo.reset()
    with mode:
        out = torch.compile(step, fullgraph=True, backend=recording)(q, pages, pages, lengths, table)
    assert out.shape == (3, 1, 8, 64) and out.device.type == "cuda"
    (graph,) = graphs
    calls = [n.target for n in graph.graph.nodes if n.op == "call_function"]
    assert torch.ops.tlc.flash_attn_with_kvcache.default in calls


def test_a_refusal_under_torch_compile_keeps_its_words() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode()
    with mode:
        q = torch.empty(2, 1, 3, 64, dtype=torch.bfloat16, device="cuda")
        k = torch.empty(2, 64, 2, 64, dtype=torch.bfloat16, device="cuda")
    torch._dynamo.reset()
    with mode, pytest.raises(Exception, match="q's 3 heads are not a multiple of the cache's 2 KV heads"):
        torch.compile(lambda q, k: tlc.flash_attn_with_kvcache(q, k, k), fullgraph=True, backend="eager")(q, k)


def test_a_build_error_is_one_line_naming_the_call_and_no_spec_line(on_cuda, monkeypatch) -> None:
    from tlc.diagnostics import Loc, error

    def failing(spec, defines, device):
        raise TlcError(error("too many registers", Loc("specs/decode_fwd.tl", 51, 3)))
    monkeypatch.setattr(kvcache, "spec_kernel", failing)
    monkeypatch.setattr(kvcache, "_sm_count", lambda device: 132)
    k, v = cache()
    with pytest.raises(TlcError) as info:
        tlc.flash_attn_with_kvcache(torch.zeros(2, 1, 4, 64, dtype=torch.bfloat16), k, v)
    assert str(info.value) == "error: flash_attn_with_kvcache: too many registers"


def test_a_program_sm90a_refuses_builds_for_sm90_with_a_warning(monkeypatch) -> None:
    from tlc import runtime
    from tlc.attention import kernels

    built = []

    def build(path, arch, defines):
        if arch == "sm_90a":
            raise kernels.fail("tlc build (sm_90a): 16 rows")
        built.append((path.name, arch))
        return "kernel"
    monkeypatch.setattr(runtime, "build", build)
    monkeypatch.setattr(kernels, "attention_target", lambda device=None: "sm_90a")
    monkeypatch.setattr(kernels, "_SPEC_KERNELS", {})
    with pytest.warns(UserWarning, match=r"no sm_90a kernel for decode_fwd .*16 rows.*using the sm_90 kernel"):
        assert kernels.spec_kernel("decode_fwd", {"Splits": 2}, None) == "kernel"
    assert built == [("decode_fwd.tl", "sm_90")]
