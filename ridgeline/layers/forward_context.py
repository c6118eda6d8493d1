"""Per-step forward metadata has one home: set around the forward (a context that refuses to nest),
read by the layers. The runner fills in what every attention backend needs (rows, block tables,
key lengths); a backend derives anything more it needs from that, once per step, and caches it on
the group (the SDPA backend's padded masks: the C kernels never pay for them)."""
from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class AttnGroup:
    """Sequences attended together: B sequences with n[i] new tokens each, decodes (all n == 1) or prefills."""
    rows: slice  # this group's rows in the flattened token batch
    start: np.ndarray  # [B] int64 tokens already cached before this step (host)
    n: np.ndarray  # [B] int64 new tokens this step (host)
    block_tables: torch.Tensor  # [B, nb] int64, padded with block 0
    key_lens: torch.Tensor  # [B] int64 tokens in the cache after this step
    # rows of a group with more than one new token per sequence: its sequence and its causal key count
    row_seq: torch.Tensor | None = None  # [Tg] int64
    row_key_lens: torch.Tensor | None = None  # [Tg] int64 = position + 1
    # [B] int64 prompt length: rows at prompt positions (row_key_lens <= tile_len) may be attended in
    # tiles; the others (outputs being verified or recomputed) as the decode step attends them
    tile_len: torch.Tensor | None = None
    derived: dict = field(default_factory=dict)  # per-backend metadata, built on first use this step

    @property
    def max_new(self) -> int:
        return int(self.n.max())


@dataclass
class ForwardContext:
    slot_mapping: torch.Tensor  # [T] int64 flat cache slot of each new token
    groups: list[AttnGroup]
    attention: torch.Tensor | None = None  # [cache slots] fp32: attention each slot receives (h2o), summed
    positions: torch.Tensor | None = None  # [T] int64 position of each new token (None: none is position 0)
    # KV groups (ridgeline/kv_groups.py) 1..: each one's slots [T] and attention groups (the same rows and
    # lengths as `groups`, over that group's block tables); slot_mapping and groups are group 0's
    kv_groups: list[tuple[torch.Tensor, list[AttnGroup]]] = field(default_factory=list)
    # per-row additions to Linear outputs this step (LoRA adapters: ridgeline/lora), called as
    # delta(linear, x, y) -> y after each Linear's own matmul and bias
    delta: Callable[[torch.nn.Module, torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    # the same additions for the C decoder stack: int64 [row slots pointer, [layers][4] tables pointer]
    # (kernels/lora_add.c), or None: a step with a delta then runs its layers as modules
    c_delta: torch.Tensor | None = None

    def for_kv_group(self, k: int) -> tuple[torch.Tensor, list[AttnGroup]]:
        """(slot mapping, attention groups) of the layers in KV group k."""
        return (self.slot_mapping, self.groups) if k == 0 else self.kv_groups[k - 1]


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


def current_delta():
    """The step's ForwardContext.delta, or None (no step in progress, or no addition)."""
    return None if _CTX is None else _CTX.delta
