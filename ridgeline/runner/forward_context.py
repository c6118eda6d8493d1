"""Per-step forward metadata has one home: set around the forward, read by the attention layers."""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch


@dataclass
class AttnGroup:
    """Sequences attended together as one padded batch: B sequences, up to Q new tokens each."""
    rows: slice  # this group's rows in the flattened token batch
    q_index: torch.Tensor  # [B, Q] int64 row of each (seq, query) in the group's rows; pads repeat a valid row
    block_tables: torch.Tensor  # [B, nb] int32 padded with block 0
    mask: torch.Tensor | None  # [B, 1, Q*G, nb*block_size] bool, True = attend; None when Q == 1 and no pad
    key_lens: torch.Tensor  # [B] int64 tokens in the cache after this step
    valid: torch.Tensor | None  # [B*Q] bool, real (non-pad) queries; None when no padding
    # prefill groups, per real query row (group order): its sequence in the group and its causal key count
    row_seq: torch.Tensor | None = None  # [Tg] int64
    row_key_lens: torch.Tensor | None = None  # [Tg] int64 = position + 1


@dataclass
class ForwardContext:
    slot_mapping: torch.Tensor  # [T] int64 flat cache slot of each new token
    groups: list[AttnGroup]


_CTX: ForwardContext | None = None


@contextmanager
def forward_context(ctx: ForwardContext):
    global _CTX
    if _CTX is not None:
        raise RuntimeError("forward contexts do not nest")
    _CTX = ctx
    try:
        yield ctx
    finally:
        _CTX = None


def get_forward_context() -> ForwardContext:
    if _CTX is None:
        raise RuntimeError("attention called outside forward_context()")
    return _CTX
