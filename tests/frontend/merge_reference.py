"""A float64 reference for specs/merge_states.tl, independent of the TL interpreter: two partial attention states
(O, LSE) over disjoint key sets merged into the state over their union, by the log-sum-exp identity."""
from __future__ import annotations

import torch


def merge_states(O_a: torch.Tensor, LSE_a: torch.Tensor, O_b: torch.Tensor, LSE_b: torch.Tensor
                 ) -> dict[str, torch.Tensor]:
    lse = torch.logaddexp(LSE_a.double(), LSE_b.double())
    w_a, w_b = torch.exp(LSE_a.double() - lse), torch.exp(LSE_b.double() - lse)
    return {"O": O_a.double() * w_a[..., None] + O_b.double() * w_b[..., None], "LSE": lse}
