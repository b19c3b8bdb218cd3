"""Row maps: a global tensor whose rows are gathered from a storage the batch shares.

    Allocate K in global (seqlen_k, HeadDim) with offset head_idx / group
        and rows at block_table[batch_idx, row / PageSize] * PageSize + row % PageSize

The program sees K as usual — `seqlen_k` rows per (batch, head), tiles at logical coordinates, masks and
bounds over logical positions — but row `row` of batch `batch_idx` is stored at row E of the storage, a
(1, heads, storage rows, cols) tensor shared by the batch: a paged KV cache (E through a block table) or
packed variable-length sequences (`cu_seqlens[batch_idx] + row`). A row whose storage row falls outside the
storage reads as zeros (a load) or is not written (a store), so no table value reaches outside the tensor
(LANGUAGE.md §5 Allocate).
"""
from __future__ import annotations

from typing import Any, Mapping

import torch

from tlc.expr import Expr
from tlc.expr.evaluate_tensor import evaluate_tensor

ROW = "row"   # the name a row map reads: the tensor's own (logical) row


def storage_rows_of(storage: torch.Tensor) -> int:
    """The rows of a gathered tensor's storage, (1, heads, rows, cols)."""
    return int(storage.shape[2])


def gather_rows(storage: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
    """The (len(at), cols) tensor of one head's storage (rows, cols) rows `at` (rows_read), zeros where a row is
    outside the storage."""
    inside = (at >= 0) & (at < storage.shape[0])
    out = torch.zeros((len(at), *storage.shape[1:]), dtype=storage.dtype)
    out[inside] = storage[at[inside]]
    return out


def rows_read(rows_at: Expr, seen: int, env: Mapping[str, Any]) -> torch.Tensor:
    """The storage rows a batch's first `seen` rows are read from (all of them, inside the storage or not)."""
    rows = torch.arange(max(seen, 0), dtype=torch.int64)
    at = evaluate_tensor(rows_at, dict(env, **{ROW: rows}))
    if at.is_floating_point() or at.dtype == torch.bool:
        raise ValueError(f"the row map '{rows_at}' gives {at.dtype} values, not whole row numbers")
    return (at.expand(rows.shape) if at.dim() == 0 else at).to(torch.int64)
