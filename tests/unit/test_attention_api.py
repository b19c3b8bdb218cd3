"""`tlc.attention` refuses what it cannot run in the caller's terms, before building anything.

CPU only: every check here comes before the CUDA check, `tlc.runtime.build` is replaced by a
function that fails the test, and the torch.compile tests trace with fake CUDA tensors.
"""
from __future__ import annotations

import inspect

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import tlc
from tlc import runtime
from tlc.attention import sdpa
from tlc.attention import torch_op  # noqa: F401  registers torch.ops.tlc.attention
from tlc.diagnostics import TlcError

BF16, FP16 = torch.bfloat16, torch.float16


@pytest.fixture(autouse=True)
def no_build(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("tlc.runtime.build was called for a call that should have been refused")
    monkeypatch.setattr(runtime, "build", refuse)


def tensors(q=(1, 4, 8, 64), k=(1, 4, 8, 64), v=None, dtypes=(BF16, BF16, BF16), grad=""):
    shapes = (q, k, v or k)
    return [torch.zeros(s, dtype=d, requires_grad=name in grad) for s, d, name in zip(shapes, dtypes, "qkv")]


def refusal(*args, **kwargs) -> str:
    with pytest.raises(TlcError) as info:
        tlc.attention(*args, **kwargs)
    (diag,) = info.value.diagnostics
    assert diag.message.startswith("tlc.attention: "), diag.message
    assert diag.loc is None and ".tl" not in str(info.value), str(info.value)
    return diag.message


# ------------------------------------------------------------------ (1) autograd
@pytest.mark.parametrize("which", ["q", "k", "v", "qkv"])
def test_inputs_that_require_grad_are_refused_naming_the_fix(which) -> None:
    message = refusal(*tensors(grad=which))
    assert f"{which[0]} requires grad" in message
    for fix in ("torch.no_grad()", "torch.inference_mode()", "scaled_dot_product_attention", "no backward"):
        assert fix in message, message


@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_inputs_that_require_grad_pass_the_autograd_check_without_grad_mode(mode) -> None:
    with mode():
        message = refusal(*tensors(grad="qkv"))  # on to the next check: these CPU tensors are not on a GPU
    assert "CUDA" in message and "grad" not in message


# ------------------------------------------------------------------ (13) shapes, in the caller's terms
@pytest.mark.parametrize("args, kwargs, expected", [
    (tensors(q=(1, 4, 8, 64), k=(1, 0, 8, 64)), dict(enable_gqa=True), "k and v have 0 heads"),
    (tensors(k=(1, 4, 8, 32), v=(1, 4, 8, 64)), {}, "k's head dim 32 must equal q's 64"),
    (tensors(v=(1, 4, 8, 128)), {}, "v's head dim 128 differs from q's 64"),
    (tensors(q=(2, 4, 8, 64)), {}, "batch sizes differ: q 2, k 1, v 1"),
    (tensors(v=(1, 4, 9, 64)), {}, "k has 8 keys but v has 9"),
    (tensors(v=(1, 2, 8, 64)), dict(enable_gqa=True), "k has 4 heads but v has 2"),
    (tensors(q=(1, 4, 8, 64), k=(1, 2, 8, 64)), {}, "pass enable_gqa=True"),
    (tensors(q=(1, 6, 8, 64), k=(1, 4, 8, 64)), dict(enable_gqa=True), "6 query heads are not a multiple of 4"),
    (tensors(dtypes=(BF16, FP16, BF16)), {}, "one dtype, bfloat16 or float16 (got q torch.bfloat16, k torch.float16"),
    (tensors(dtypes=(torch.float32,) * 3), {}, "bfloat16 or float16"),
    (tensors(q=(1, 4, 8, 59), k=(1, 4, 8, 59)), {},
     "head dim 59 is not supported; supported: multiples of 8 from 8 to 256"),
    (tensors(q=(1, 4, 8, 512), k=(1, 4, 8, 512)), {}, "head dim 512 is not supported"),
    (tensors(q=(1, 4, 8, 0), k=(1, 4, 8, 0)), {}, "head dim 0 is not supported"),
    (tensors(), dict(scale="0.1"), "scale must be a number"),
    (tensors(), {}, "q, k and v must be CUDA tensors (got cpu, cpu, cpu)"),
], ids=["zero-kv-heads", "k-head-dim", "v-head-dim", "batch", "kv-seqlen", "kv-heads", "gqa-flag", "gqa-multiple",
        "dtype-mismatch", "float32", "head-dim-59", "head-dim-512", "head-dim-0", "scale", "cpu"])
def test_bad_calls_are_refused_before_building(args, kwargs, expected) -> None:
    assert expected in refusal(*args, **kwargs)


def test_the_supported_head_dims_are_one_rule() -> None:
    assert sdpa.head_dim_problem(64, 64) is None and sdpa.head_dim_problem(192, 128) is None
    assert sdpa.head_dim_problem(59, 59) == ("head dim 59 is not supported; "
                                                    "supported: multiples of 8 from 8 to 256")
    for d in (40, 80, 96, 112, 160, 224):  # FlashAttention's test widths, padded inside the kernel
        assert sdpa.head_dim_problem(d, d) is None
    assert "192 with v's 128" in sdpa.head_dim_problem(128, 64)


def test_empty_queries_give_an_empty_output_like_sdpa() -> None:
    q, k, v = tensors(q=(2, 4, 0, 64), v=(1, 4, 8, 64))
    q, k, v = q, k.expand(2, -1, -1, -1), v.expand(2, -1, -1, -1)
    out = torch.ops.tlc.attention(q, k, v)  # the op's own implementation (CPU tensors reach it here)
    assert out.shape == (2, 4, 0, 64) and out.dtype == BF16


def test_no_keys_give_zeros_like_sdpa() -> None:
    q, k, v = (torch.randn(s, dtype=BF16) for s in ((1, 2, 5, 64), (1, 2, 0, 64), (1, 2, 0, 64)))
    out = torch.ops.tlc.attention(q, k, v, None, 0.0, True)
    assert torch.equal(out, torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))
    assert torch.equal(out, torch.zeros(1, 2, 5, 64, dtype=BF16))


def test_kernel_layout_copies_only_what_the_kernel_cannot_read() -> None:
    t = torch.randn(1, 2, 8, 64, dtype=BF16)
    assert sdpa.kernel_layout(t) is t
    strided = torch.randn(1, 8, 2, 64, dtype=BF16).transpose(1, 2)  # (B, S, H, D) storage, as many models keep it
    assert sdpa.kernel_layout(strided) is strided
    transposed = torch.randn(1, 2, 64, 8, dtype=BF16).transpose(2, 3)
    fixed = sdpa.kernel_layout(transposed)
    assert fixed.is_contiguous() and torch.equal(fixed, transposed)
    misaligned = torch.randn(1 * 2 * 8 * 64 + 1, dtype=BF16)[1:].view(1, 2, 8, 64)
    assert sdpa.kernel_layout(misaligned).data_ptr() % 16 == 0


# ------------------------------------------------------------------ (16) torch.compile sees one op
def fake_cuda(*shapes, dtype=BF16):
    mode = FakeTensorMode()
    with mode:
        return mode, [torch.empty(s, dtype=dtype, device="cuda") for s in shapes]


def attend(q, k, v):
    return tlc.attention(q, k, v, is_causal=True, enable_gqa=True) * 2


def test_torch_compile_fullgraph_traces_tlc_attention_as_one_op() -> None:
    graphs = []

    def recording_eager(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    mode, (q, k, v) = fake_cuda((2, 8, 33, 64), (2, 2, 17, 64), (2, 2, 17, 64))
    torch._dynamo.reset()
    with mode:
        out = torch.compile(attend, fullgraph=True, backend=recording_eager)(q, k, v)
    assert out.shape == (2, 8, 33, 64) and out.dtype == BF16 and out.device.type == "cuda"
    (graph,) = graphs
    assert [n.target for n in graph.graph.nodes if n.op == "call_function"][0] is torch.ops.tlc.attention.default


def test_make_fx_records_the_tlc_op_with_the_output_shape_of_v() -> None:
    from torch.fx.experimental.proxy_tensor import make_fx

    _, (q, k, v) = fake_cuda((1, 4, 16, 192), (1, 4, 16, 192), (1, 4, 16, 128))
    graph = make_fx(attend, tracing_mode="fake")(q, k, v)
    calls = [n for n in graph.graph.nodes if n.target is torch.ops.tlc.attention.default]
    assert len(calls) == 1 and tuple(calls[0].meta["val"].shape) == (1, 4, 16, 128)


def test_the_op_refuses_backward_honestly() -> None:
    q, k, v = (torch.randn(1, 2, 3, 64, dtype=BF16, requires_grad=True) for _ in range(3))
    out = torch.ops.tlc.attention(q, k.detach()[:, :, :0], v.detach()[:, :, :0])
    with pytest.raises(TlcError, match="no backward"):
        out.sum().backward()


def test_opcheck_agrees_with_the_fake_implementation_where_cpu_can_run_the_op() -> None:
    q, k = torch.randn(1, 2, 5, 64, dtype=BF16), torch.randn(1, 2, 0, 64, dtype=BF16)  # no keys: no kernel needed
    results = torch.library.opcheck(torch.ops.tlc.attention.default, (q, k, k, None, 0.0, True, None, False))
    assert set(results.values()) == {"SUCCESS"}, results


def test_torch_compile_aot_eager_without_grad_mode() -> None:
    mode, (q, k, v) = fake_cuda((1, 2, 5, 128), (1, 2, 9, 128), (1, 2, 9, 128))
    torch._dynamo.reset()
    with mode, torch.no_grad():
        out = torch.compile(attend, fullgraph=True, backend="aot_eager")(q, k, v)
    assert out.shape == (1, 2, 5, 128)


@pytest.mark.parametrize("fullgraph", [False, True])
def test_a_refusal_under_torch_compile_keeps_its_words(fullgraph) -> None:
    mode, (q,) = fake_cuda((1, 2, 5, 59))
    torch._dynamo.reset()
    with mode, pytest.raises(Exception) as info:
        torch.compile(lambda q: tlc.attention(q, q, q), fullgraph=fullgraph, backend="eager")(q)
    if not fullgraph:  # dynamo falls back to eager at the refusal, which raises the TlcError itself
        assert info.type is TlcError
    assert "tlc.attention: head dim 59 is not supported" in str(info.value)


def test_a_build_error_names_no_spec_line(monkeypatch) -> None:
    from tlc.diagnostics import Loc, Note, error

    def failing_build(spec, **kwargs):
        raise TlcError(error("too many registers", Loc(str(spec), 51, 3), Note("to fit: lower BM")))

    monkeypatch.setattr(runtime, "build", failing_build)
    monkeypatch.setattr(runtime, "device_arch", lambda device=None: "sm_90")
    q = torch.zeros(1, 2, 4, 64, dtype=BF16)
    with pytest.raises(TlcError) as info:
        sdpa.run_attention(q, q, q, False, None)
    assert str(info.value) == "error: tlc.attention: too many registers\nnote: to fit: lower BM"


def test_eager_calls_skip_the_op_dispatch_and_traced_calls_keep_it() -> None:
    """Plain tensors run the implementation directly (no torch.library dispatch); fake tensors and
    tracing modes must see the op, so make_fx and torch.compile record it (tests above)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from tlc.attention.sdpa import _eager

    plain = torch.zeros(1, 1, 1, 8)
    assert _eager(plain, plain, plain)
    with FakeTensorMode() as mode:
        fake = mode.from_tensor(plain)
        assert not _eager(fake, fake, fake)


# ------------------------------------------------------------------ SDPA's signature, attn_mask and dropout_p
SDPA_PARAMETERS = [("query", inspect.Parameter.empty), ("key", inspect.Parameter.empty),
                   ("value", inspect.Parameter.empty), ("attn_mask", None), ("dropout_p", 0.0),
                   ("is_causal", False), ("scale", None), ("enable_gqa", False)]


@pytest.mark.parametrize("function", [tlc.attention, sdpa.attention], ids=["tlc", "sdpa"])
def test_the_signature_is_sdpas_names_order_and_defaults(function) -> None:
    documented = " ".join(torch.nn.functional.scaled_dot_product_attention.__doc__.split("->")[0].split())
    assert documented == ("scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, "
                          "is_causal=False, scale=None, enable_gqa=False)")
    parameters = inspect.signature(function).parameters.values()
    assert [(p.name, p.default) for p in parameters] == SDPA_PARAMETERS
    assert all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in parameters)


def test_the_op_schema_is_sdpas() -> None:
    """aten's schema makes scale and enable_gqa keyword-only; the op takes them positionally too."""
    ours = torch.ops.tlc.attention.default._schema.arguments
    sdpa = torch.ops.aten.scaled_dot_product_attention.default._schema.arguments
    assert [(a.name, str(a.type), a.default_value) for a in ours] == \
           [(a.name, str(a.type), a.default_value) for a in sdpa]


def test_a_positional_sdpa_call_means_what_it_means_for_sdpa() -> None:
    from torch.fx.experimental.proxy_tensor import make_fx

    _, (q, k) = fake_cuda((1, 4, 16, 64), (1, 2, 16, 64))
    graph = make_fx(lambda q, k: tlc.attention(q, k, k, None, 0.0, True, 0.5, True), tracing_mode="fake")(q, k)
    (call,) = [n for n in graph.graph.nodes if n.target is torch.ops.tlc.attention.default]
    assert call.args[3:] == (None, 0.0, True, 0.5, True)   # attn_mask, dropout_p, is_causal, scale, enable_gqa


def test_the_old_positional_is_causal_is_refused_naming_the_keyword() -> None:
    message = refusal(*tensors(), True)
    assert message == ("tlc.attention: attn_mask is True, a bool: the 4th argument is attn_mask, as in "
                       "scaled_dot_product_attention; pass is_causal=True by name")


@pytest.mark.parametrize("mask", [torch.ones(8, 8, dtype=torch.bool), torch.zeros(1, 1, 8, 8, dtype=BF16)],
                         ids=["boolean", "additive"])
@pytest.mark.parametrize("causal", [False, True])
def test_an_attn_mask_is_refused_naming_what_to_do(mask, causal) -> None:
    message = refusal(*tensors(), attn_mask=mask, is_causal=causal)
    assert message.startswith("tlc.attention: attn_mask is not supported yet")
    assert "is_causal=True" in message and "scaled_dot_product_attention" in message


@pytest.mark.parametrize("dropout_p, expected", [
    (0.1, "dropout_p is 0.1, but tlc has no dropout (forward inference only): pass dropout_p=0.0"),
    (1, "dropout_p is 1, but tlc has no dropout"),
    (1.0, "dropout_p is 1.0, but tlc has no dropout"),
    (1e-300, "dropout_p is 1e-300, but tlc has no dropout"),
    (-0.1, "dropout_p must be from 0 to 1, got -0.1"),
    (1.5, "dropout_p must be from 0 to 1, got 1.5"),
    (float("nan"), "dropout_p must be from 0 to 1, got nan"),
    (-float("inf"), "dropout_p must be from 0 to 1, got -inf"),
    (10 ** 400, "dropout_p must be from 0 to 1, got 1000000000000000… (401 characters)"),
    ("0", "dropout_p must be a number from 0 to 1 (0.0: no dropout), not a str"),
    (None, "dropout_p must be a number from 0 to 1 (0.0: no dropout), not a NoneType"),
    (False, "dropout_p must be a number from 0 to 1 (0.0: no dropout), not a bool"),
    (torch.tensor(0.0), "dropout_p must be a number from 0 to 1 (0.0: no dropout), not a Tensor"),
], ids=["0.1", "int-1", "1.0", "tiny", "negative", "1.5", "nan", "-inf", "huge-int", "str", "none", "bool", "tensor"])
def test_dropout_is_refused_and_so_is_what_sdpa_refuses(dropout_p, expected) -> None:
    for args, kwargs in (((*tensors(), None, dropout_p), {}), (tensors(), {"dropout_p": dropout_p})):
        assert refusal(*args, **kwargs).startswith(f"tlc.attention: {expected}")


@pytest.mark.parametrize("dropout_p", [0, 0.0, -0.0], ids=["int", "float", "negative-zero"])
def test_no_dropout_passes_on_to_the_next_check(dropout_p) -> None:
    assert "must be CUDA tensors" in refusal(*tensors(), None, dropout_p, True)


def test_the_op_refuses_what_its_kernel_would_ignore() -> None:
    q, k, v = (torch.randn(s, dtype=BF16) for s in ((1, 2, 5, 64), (1, 2, 0, 64), (1, 2, 0, 64)))
    mask = torch.ones(5, 0, dtype=torch.bool)
    for args, kwargs, words in (((q, k, v, mask), {}, "attn_mask is not supported yet"),
                                ((q, k, v), {"dropout_p": 0.5}, "dropout_p is 0.5, but tlc has no dropout"),
                                ((q, k[:, :1], v[:, :1]), {}, "2 query heads but 1 KV heads; pass enable_gqa=True")):
        with pytest.raises(TlcError, match=words):
            torch.ops.tlc.attention(*args, **kwargs)
        with pytest.raises(TlcError, match=words):   # the fake implementation: tracing refuses it too
            with FakeTensorMode() as mode:
                torch.ops.tlc.attention(*(mode.from_tensor(t) for t in args), **kwargs)
    assert torch.ops.tlc.attention(q, k[:, :1], v[:, :1], enable_gqa=True).shape == (1, 2, 5, 64)


@pytest.mark.parametrize("fullgraph", [False, True])
@pytest.mark.parametrize("call, words", [
    (lambda q, m: tlc.attention(q, q, q, m), "tlc.attention: attn_mask is not supported yet"),
    (lambda q, m: tlc.attention(q, q, q, dropout_p=0.25), "tlc.attention: dropout_p is 0.25, but tlc has no dropout"),
], ids=["attn_mask", "dropout"])
def test_mask_and_dropout_refusals_under_torch_compile_keep_their_words(fullgraph, call, words) -> None:
    mode, (q, mask) = fake_cuda((1, 2, 5, 64), (5, 5))
    torch._dynamo.reset()
    with mode, pytest.raises(Exception) as info:
        torch.compile(call, fullgraph=fullgraph, backend="eager")(q, mask)
    if not fullgraph:
        assert info.type is TlcError
    assert words in str(info.value).split("from user code")[0]   # not in the quoted source line of `call`


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_torch_compile_with_dynamic_shapes_traces_one_op(backend) -> None:
    """dynamic=True makes the head dims symbolic ints: the head-dim check compares them (dynamo guards on
    the answer) instead of looking them up in a range, which dynamo cannot do for a symbolic int."""
    mode, (q, k, q2, k2, v2) = fake_cuda((2, 8, 33, 64), (2, 2, 17, 64), (1, 4, 9, 192), (1, 4, 7, 192),
                                         (1, 4, 7, 128))
    torch._dynamo.reset()
    with mode:
        gqa = torch.compile(attend, fullgraph=True, backend=backend, dynamic=True)(q, k, k)
        mla = torch.compile(lambda q, k, v: tlc.attention(q, k, v), fullgraph=True, backend=backend,
                            dynamic=True)(q2, k2, v2)
    assert gqa.shape == (2, 8, 33, 64) and mla.shape == (1, 4, 9, 128)
