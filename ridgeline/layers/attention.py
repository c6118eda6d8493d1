"""Attention over the paged KV cache, behind a backend registry.

Grouped-query trick (SDPA backend): the G = H / Hkv query heads that share a KV head are laid out
as extra query rows, so SDPA runs per KV head with no KV repetition: q [B, Hkv, Q*G, D] against
k [B, Hkv, L, D] gathered from the block tables.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ridgeline.kernels import cpu_attention
from ridgeline.runner.forward_context import AttnGroup, get_forward_context

BACKENDS: dict[str, Callable] = {}
SMALL_ATTENTION = 4096  # B * Q * L below which plain matmul-softmax-matmul beats SDPA on a CPU
PREFILL_IN_C = True  # "auto" on a CPU: prefill chunks through the paged C kernel too (else SDPA)


def register_backend(name: str):
    def deco(fn):
        BACKENDS[name] = fn
        return fn
    return deco


@register_backend("sdpa")
def paged_sdpa(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, g: AttnGroup, scale: float,
               window: int | None) -> torch.Tensor:
    """q [Tg, H, D] (the group's rows); caches [NB, bs, Hkv, D] -> [Tg, H*D]. The window is in g.mask."""
    B, Q = g.q_index.shape
    _, bs, Hkv, D = k_cache.shape
    H = q.shape[1]
    G = H // Hkv
    qg = q[g.q_index] if g.valid is not None else q.view(B, Q, H, D)
    qg = qg.view(B, Q, Hkv, G, D).transpose(1, 2).reshape(B, Hkv, Q * G, D)
    L = g.block_tables.shape[1] * bs
    flat = g.block_tables.view(-1)
    # math in q's dtype: fp32 on a CPU even over a bf16 cache (CPU bf16 SDPA is slow)
    k = k_cache.index_select(0, flat).to(q.dtype).view(B, L, Hkv, D).transpose(1, 2)
    v = v_cache.index_select(0, flat).to(q.dtype).view(B, L, Hkv, D).transpose(1, 2)
    if B * Q * L <= SMALL_ATTENTION:  # SDPA's CPU kernel has a fixed cost far above this much math
        s = (qg @ k.transpose(-1, -2)).mul_(scale).masked_fill_(~g.mask, float("-inf"))
        o = torch.softmax(s, dim=-1) @ v
    else:
        o = F.scaled_dot_product_attention(qg, k, v, attn_mask=g.mask, scale=scale)  # [B, Hkv, Q*G, D]
    o = o.view(B, Hkv, Q, G, D).transpose(1, 2).reshape(B * Q, H * D)
    return o if g.valid is None else o[g.valid]


@register_backend("auto")
def paged_auto(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, g: AttnGroup, scale: float,
               window: int | None) -> torch.Tensor:
    """On a CPU (fp32 or bf16 cache): the C kernel reading blocks in place, for decode rows and for
    each row of a prefill chunk as a query at its own position; elsewhere SDPA."""
    if (k_cache.device.type == "cpu" and k_cache.dtype in (torch.float32, torch.bfloat16)
            and cpu_attention.available()):
        if g.q_index.shape[1] == 1:
            return cpu_attention.paged_decode(q, k_cache, v_cache, g.block_tables, g.key_lens, scale, window)
        if g.row_seq is not None and PREFILL_IN_C:
            return cpu_attention.paged_decode(q, k_cache, v_cache, g.block_tables, g.row_key_lens, scale, window,
                                              row_seq=g.row_seq)
    return paged_sdpa(q, k_cache, v_cache, g, scale, window)


class Attention(nn.Module):
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, backend: str = "auto",
                 sliding_window: int | None = None):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = head_dim ** -0.5
        self.window = sliding_window
        self.backend = BACKENDS[backend]
        self.k_cache = self.v_cache = torch.empty(0)  # [NB, bs, Hkv, D], bound by the runner

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [T, H, D], k/v [T, Hkv, D] -> [T, H*D] in q's dtype."""
        ctx = get_forward_context()
        flat_k = self.k_cache.view(-1, self.num_kv_heads, self.head_dim)
        flat_v = self.v_cache.view(-1, self.num_kv_heads, self.head_dim)
        flat_k.index_copy_(0, ctx.slot_mapping, k.to(flat_k.dtype))
        flat_v.index_copy_(0, ctx.slot_mapping, v.to(flat_v.dtype))
        return self.attend(q)

    def attend(self, q: torch.Tensor) -> torch.Tensor:
        """q [T, H, D], with this step's K/V already in the cache -> [T, H*D] in q's dtype."""
        ctx = get_forward_context()
        if len(ctx.groups) == 1:
            g = ctx.groups[0]
            return self.backend(q, self.k_cache, self.v_cache, g, self.scale, self.window).to(q.dtype)
        out = q.new_empty(q.shape[0], self.num_heads * self.head_dim)
        for g in ctx.groups:
            out[g.rows] = self.backend(q[g.rows], self.k_cache, self.v_cache, g, self.scale, self.window).to(q.dtype)
        return out
