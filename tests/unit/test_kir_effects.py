"""The kernel-IR effect interface: every op class declares what it reads, writes and does, and the
declarations say what the ops do (copies, async copies, wgmma, barriers, TMA, tokens, regions)."""
from __future__ import annotations

from dataclasses import dataclass, fields

import pytest

from tlc.kir import ops as K
from tlc.kir import ops_sm90 as H
from tlc.kir.effects import NONE, PURE, Effect
from tlc.kir.expr import E, Var
from tlc.kir.ops import OP_CLASSES
from tlc.kir.sm90_protocol import _handler
from tlc.kir.sm90_protocol_sync import INERT

# What the protocol checker must model: shared memory, async tokens and the synchronising kinds.
_SYNCHRONISING = Effect.CP_ASYNC | Effect.ASYNC_GROUP | Effect.BARRIER | Effect.MBARRIER | Effect.PROXY_FENCE


@pytest.mark.parametrize("name", sorted(OP_CLASSES))
def test_every_op_class_declares_its_effects_over_its_own_fields(name):
    cls = OP_CLASSES[name]
    assert cls.declared_effects is not None, f"{name} declares no effects"
    assert cls.declared_effects.field_names() <= {f.name for f in fields(cls)}


def test_an_op_class_that_declares_nothing_is_refused_not_taken_as_effect_free():
    @dataclass(frozen=True, kw_only=True)
    class NewOp(K.Op):
        """An op someone adds without a declaration."""

        target: str

    assert K.Op.declared_effects is None
    with pytest.raises(TypeError, match="NewOp declares no effects"):
        NewOp(target="tSrS").effects()


def test_a_copy_reads_and_writes_its_operands_and_the_shared_buffers_it_lists():
    s2r = K.CopyOp(copy="s2r", src=E("tSsK[_, _, kb]"), dst=Var("tSrK"), reads=("sK",))
    e = s2r.effects()
    assert (e.reads, e.writes) == ({"tSsK"}, {"tSrK"})
    assert (e.shared_reads, e.shared_writes, e.cp_async_writes, e.kinds) == ({"sK"}, set(), set(), Effect.NONE)
    r2s = K.CopyOp(copy="r2s", src=Var("tOrO"), dst=Var("tOsO"), writes=("sO",))
    assert r2s.effects().shared_writes == {"sO"} and not r2s.effects().shared_reads


def test_an_async_copy_writes_its_buffer_when_the_wait_lands_and_defines_a_token():
    op = K.AsyncCopyOp(token="tok_K", copy="g2s", src=E("tKgK[_, _, _, n]"), dst=Var("tKsK"), buffer="sK")
    e = op.effects()
    assert e.cp_async_writes == {"sK"} and not e.shared_writes and not e.tma_writes
    assert e.tokens_defined == {"tok_K"} and e.kinds == Effect.CP_ASYNC
    assert e.reads == {"tKgK"} and e.writes == {"tKsK"}
    no_buffer = K.AsyncCopyOp(token="t", copy="g2s", src=Var("a"), dst=Var("b"))
    assert not no_buffer.effects().cp_async_writes


def test_commit_and_wait_use_tokens_and_groups_not_cpp_names():
    commit = K.CommitOp(name="grp_K", tokens=("tok_K", "tok_K_edge")).effects()
    assert commit.tokens_used == {"tok_K", "tok_K_edge"} and commit.tokens_defined == {"grp_K"}
    assert commit.kinds == Effect.ASYNC_GROUP and not commit.reads
    wait = K.WaitOp(pending=1, groups=("grp_K",)).effects()
    assert wait.tokens_used == {"grp_K"} and wait.kinds == Effect.ASYNC_GROUP


def test_a_wgmma_reads_its_operands_and_the_shared_buffers_its_descriptors_read():
    op = H.WgmmaOp(mma="wgmma_O", acc="tOrO", a=Var("tOrP"), b=E("tOsV[_, _, _, stage]"), reads=("sV",))
    e = op.effects()
    assert e.reads == {"tOrP", "tOsV", "tOrO"} and e.writes == {"tOrO"}
    assert e.shared_reads == {"sV"} and e.kinds == Effect.WGMMA
    fresh = H.WgmmaOp(mma="wgmma_S", acc="tSrS", a=Var("tSrQ"), b=Var("tSrK"), zero_init=True, reads=("sQ", "sK"))
    assert fresh.effects().reads == {"tSrQ", "tSrK"}     # zero_init overwrites the accumulator unread
    for op in (H.WgmmaCommitOp(), H.WgmmaWaitOp(pending=0)):
        assert op.effects().kinds == Effect.WGMMA | Effect.ASYNC_GROUP


@pytest.mark.parametrize("op", [K.BarrierOp(), H.NamedBarrierOp(id=0, threads=256)])
def test_a_barrier_is_a_barrier_and_touches_no_tensor(op):
    e = op.effects()
    assert e.kinds == Effect.BARRIER
    assert e == type(e)(kinds=Effect.BARRIER)


def test_tma_loads_complete_on_an_mbarrier_and_tma_stores_read_shared_memory():
    load = H.TmaLoadOp(desc="tma_K", bar="full_sK", stage=Var("s"), dst="sK", coord=(E("n * 128"), Var("h")))
    e = load.effects()
    assert e.tma_writes == {"sK"} and not e.cp_async_writes and not e.shared_writes
    assert e.kinds == Effect.TMA | Effect.MBARRIER
    store = H.TmaStoreOp(desc="tma_O", src="sO_out", coord=(Var("m"), Var("h"))).effects()
    assert store.shared_reads == {"sO_out"} and Effect.TMA in store.kinds and Effect.GLOBAL_WRITE in store.kinds


def test_row_math_reads_and_writes_row_vectors_and_fragments():
    assert K.RowReduceOp(dst="m", src="tSrS", kind="max", accumulate=False).effects().reads == {"tSrS"}
    assert K.RowReduceOp(dst="m", src="tSrS", kind="max", accumulate=True).effects().reads == {"tSrS", "m"}
    allreduce = K.AllReduceOp(target="l", kind="sum", width=4).effects()
    assert allreduce.reads == allreduce.writes == {"l"} and allreduce.kinds == Effect.WARP_COLLECTIVE
    add = K.MapOp(target="l", srcs=("l", "x"), fn=E("x0 + x1")).effects()
    assert add.reads == {"l", "x"} and add.writes == {"l"}


def test_declarations_define_names_and_do_nothing_else():
    for cls in (K.SharedBufferOp, K.FragmentOp, K.RowVectorOp, K.LetOp, H.MbarrierOp, H.TmaDescriptorOp):
        assert cls.declared_effects is PURE
    assert K.LetOp(name="m_block", type="i32", value=Var("blockIdx.x")).effects().is_pure()


def test_a_region_op_does_what_its_body_does():
    copy = K.CopyOp(copy="s2r", src=Var("tSsK"), dst=Var("tSrK"), reads=("sK",))
    branch = K.IfOp(cond=E("n < 4"), body=(copy, K.BarrierOp()))
    assert branch.effects() == NONE                       # not its own: its ops'
    nested = K.nested_effects(K.ForOp(var="k", start=E("0"), stop=E("2"), step=1, body=(branch,)))
    assert nested.shared_reads == {"sK"} and nested.kinds == Effect.BARRIER


@pytest.mark.parametrize("name", sorted(OP_CLASSES))
def test_the_protocol_checker_models_every_op_that_synchronises_or_touches_shared_memory(name):
    cls = OP_CLASSES[name]
    decl = cls.declared_effects
    touches = bool(decl.shared_reads or decl.shared_writes or decl.cp_async_writes or decl.tma_writes
                   or decl.tokens_used or decl.tokens_defined or decl.kinds & _SYNCHRONISING)
    if issubclass(cls, INERT):
        assert not touches, f"{name} is inert to the protocol checker but declares a shared or synchronising effect"
    elif touches:
        assert _handler(cls) is not None, f"{name} synchronises or touches shared memory: the checker needs a handler"
