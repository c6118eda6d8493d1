"""Attention over the paged KV cache, behind a backend registry.

A backend is chosen per layer when its cache is bound (`Attention.bind`), never per step:
- "paged_c": kernels/paged_attention.c reads CPU blocks of every KV format in place (dequantizing
  inside the kernel), for decode rows and for each row of a prefill chunk as a query at its own
  position (key_lens = position + 1); prompt rows go through the tiled kernel (paged_prefill.c),
  rows past the prompt (proposals being verified, outputs recomputed) through the per-row kernel
  the decode step uses, so they equal what plain decoding computes bit for bit.
- "sdpa": gathers each sequence's blocks (dequantized) into a padded view and calls SDPA. Grouped-query trick:
  the G = H / Hkv query heads that share a KV head are laid out as extra query rows, so SDPA runs
  per KV head with no KV repetition: q [B, Hkv, Q*G, D] against k [B, Hkv, L, D].
- "flash" (layers/attention_flash.py): FlashAttention's variable-length kernel on CUDA.
- "auto": paged_c where the kernel plan has it and the cache format is one it reads, else flash where
  it runs (CUDA, fp16/bf16 cache), else sdpa.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ridgeline.errors import InvalidRequestError
from ridgeline.kernels import cpu_attention
from ridgeline.layers.forward_context import AttnGroup, get_forward_context
from ridgeline.layers.kernel_plan import KernelPlan
from ridgeline.layers.kv_cache import LayerKV
from ridgeline.formats.kv import hadamard

BACKENDS: dict[str, type[AttentionBackend]] = {}
AUTO_ORDER = ("paged_c", "flash", "sdpa")
SMALL_ATTENTION = 4096  # B * Q * L below which plain matmul-softmax-matmul beats SDPA on a CPU


def register_backend(name: str):
    def deco(cls):
        cls.name = name
        BACKENDS[name] = cls
        return cls
    return deco


class AttentionBackend:
    name = "?"

    @staticmethod
    def unsupported(kv: LayerKV, plan: KernelPlan) -> str | None:
        """Why this backend cannot serve this cache under this plan, or None if it can."""
        return None

    softcap: float | None = None  # scores -> softcap * tanh(scores / softcap) (Gemma 2); paged_c and sdpa have it
    has_softcap = False
    # [H] fp32 learned logits, one per query head, each in its head's softmax as a key without a value
    # (GPT-OSS's attention sinks); paged_c and sdpa have them
    sinks: torch.Tensor | None = None
    has_sinks = False

    def __call__(self, q: torch.Tensor, kv: LayerKV, g: AttnGroup, scale: float, window: int | None) -> torch.Tensor:
        """q [Tg, H, D] (the group's rows), this step's K/V already in the cache -> [Tg, H*D]."""
        raise NotImplementedError


@dataclass
class GatheredAttention:
    """One attention group's queries and its blocks' K/V gathered for dense math: qg [B, Hkv, Q*G, D]
    (rows of a GQA group together), k, v [B, Hkv, L, D] in q's dtype, mask [B, 1 or Hkv, Q*G, L]."""
    qg: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    mask: torch.Tensor
    valid: torch.Tensor | None  # real rows among the padded [B * Q], or None when none is padded
    B: int
    Q: int
    G: int

    def output(self, o: torch.Tensor, kv: LayerKV, dtype: torch.dtype) -> torch.Tensor:
        """o [B, Hkv, Q*G, D] -> [rows, H * D] in the group's row order."""
        B, Hkv, _, D = o.shape
        o = o.view(B, Hkv, self.Q, self.G, D).transpose(1, 2).reshape(B * self.Q, Hkv * self.G, D)
        if kv.v_fmt.rotate:  # V is stored rotated: sum p H v = H o, and H undoes itself
            o = hadamard(o).to(dtype)
        o = o.reshape(B * self.Q, -1)
        return o if self.valid is None else o[self.valid]


def gather_attention(q: torch.Tensor, kv: LayerKV, g: AttnGroup, window: int | None) -> GatheredAttention:
    B, Q = len(g.n), g.max_new
    _, bs, Hkv, _ = kv.k.shape
    H, D = q.shape[1:]
    G = H // Hkv
    q_index, mask, valid = sdpa_view(g, bs, G, window, q.device)
    qg = q[q_index] if valid is not None else q.view(B, Q, H, D)
    if kv.k_fmt.rotate:  # K is stored rotated: (Hq).(Hk) = q.k
        qg = hadamard(qg).to(q.dtype)
    qg = qg.view(B, Q, Hkv, G, D).transpose(1, 2).reshape(B, Hkv, Q * G, D)
    L = g.block_tables.shape[1] * bs
    # math in q's dtype: fp32 on a CPU even over a bf16 or quantized cache (CPU bf16 SDPA is slow)
    k, v = kv.read(g.block_tables.view(-1), q.dtype)
    if kv.k_centers is not None:  # position 0 is stored minus its own center; read() made k a new tensor
        k.view(B, L, Hkv, D)[:, 0] += kv.k0_offset.to(k.dtype)
    k, v = k.view(B, L, Hkv, D).transpose(1, 2), v.view(B, L, Hkv, D).transpose(1, 2)
    return GatheredAttention(qg, k, v, mask, valid, B, Q, G)


@register_backend("sdpa")
class PagedSDPA(AttentionBackend):
    has_softcap = has_sinks = True

    def __call__(self, q, kv, g, scale, window):
        a = gather_attention(q, kv, g, window)
        if self.softcap is not None or self.sinks is not None:  # SDPA has neither: the scores are built here
            s = (a.qg @ a.k.transpose(-1, -2)).mul_(scale)
            if self.softcap is not None:
                s = torch.tanh(s / self.softcap).mul_(self.softcap)
            s = s.masked_fill_(~a.mask, float("-inf"))
            if self.sinks is None:
                o = torch.softmax(s, dim=-1) @ a.v
            else:  # rows are (query, head in the KV head's group): the sink of head hk * G + g, as a last column
                Hkv = a.qg.shape[1]
                sink = self.sinks.to(s.dtype).view(1, Hkv, 1, a.G, 1).expand(a.B, Hkv, a.Q, a.G, 1)
                p = torch.softmax(torch.cat([s, sink.reshape(a.B, Hkv, a.Q * a.G, 1)], dim=-1), dim=-1)
                o = p[..., :-1] @ a.v
        elif a.B * a.Q * a.k.shape[2] <= SMALL_ATTENTION:  # SDPA's CPU kernel has a fixed cost far above this
            s = (a.qg @ a.k.transpose(-1, -2)).mul_(scale).masked_fill_(~a.mask, float("-inf"))
            o = torch.softmax(s, dim=-1) @ a.v
        else:
            o = F.scaled_dot_product_attention(a.qg, a.k, a.v, attn_mask=a.mask, scale=scale)  # [B, Hkv, Q*G, D]
        return a.output(o, kv, q.dtype)


def sdpa_view(g: AttnGroup, bs: int, G: int, window: int | None, device: torch.device):
    """(q_index [B, Q] row of each (seq, query), pads repeating a valid row; mask [B, 1, Q*G, L] bool,
    True = attend; valid [B*Q] bool real queries, None without padding), built once per group and step."""
    key = ("sdpa", bs, G, window)
    if key not in g.derived:
        start, n = g.start, g.n
        B, Q = len(n), int(n.max())
        L = g.block_tables.shape[1] * bs
        qi, keys = np.arange(Q), np.arange(L)
        pos = (start[:, None] + qi[None, :])[:, :, None]  # [B, Q, 1]
        allowed = (keys[None, None, :] <= pos) & (keys[None, None, :] < (start + n)[:, None, None])
        if window:
            allowed &= keys[None, None, :] > pos - window
        mask = torch.from_numpy(allowed)
        mask = mask.view(B, 1, 1, L) if Q == 1 else mask.unsqueeze(2).expand(B, Q, G, L).reshape(B, 1, Q * G, L)
        q_index = (np.cumsum(n) - n)[:, None] + np.minimum(qi[None, :], n[:, None] - 1)
        valid = torch.from_numpy((qi[None, :] < n[:, None]).reshape(-1)).to(device) if (n != Q).any() else None
        g.derived[key] = (torch.from_numpy(q_index).to(device), mask.to(device), valid)
    return g.derived[key]


@register_backend("paged_c")
class PagedC(AttentionBackend):
    has_softcap = has_sinks = True

    @staticmethod
    def unsupported(kv, plan):
        if not plan.c_attention:
            return "no C attention kernel in this kernel plan"
        if kv.c_format is None:
            return f"the C attention kernel does not read {kv.formats} caches on {kv.k.device.type}"
        return None

    def __call__(self, q, kv, g, scale, window):
        if g.row_seq is None:  # one new token per sequence
            return cpu_attention.paged_decode(q, kv.k, kv.v, g.block_tables, g.key_lens, scale, window,
                                              kv_format=kv.c_format, k_scale=kv.k_scale, v_scale=kv.v_scale,
                                              k0_offset=kv.k0_offset, softcap=self.softcap, sinks=self.sinks)
        return cpu_attention.paged_decode(q, kv.k, kv.v, g.block_tables, g.row_key_lens, scale, window,
                                          row_seq=g.row_seq, kv_format=kv.c_format, k_scale=kv.k_scale,
                                          v_scale=kv.v_scale, tile_len=g.tile_len, k0_offset=kv.k0_offset,
                                          softcap=self.softcap, sinks=self.sinks)


def resolve_backend(name: str, kv: LayerKV, plan: KernelPlan, softcap: float | None = None,
                    sinks: torch.Tensor | None = None) -> AttentionBackend:
    if name == "auto":  # the first of these that can serve this cache (soft-cap its scores, add sinks, where asked)
        name = next(n for n in AUTO_ORDER if n in BACKENDS and not BACKENDS[n].unsupported(kv, plan)
                    and (softcap is None or BACKENDS[n].has_softcap) and (sinks is None or BACKENDS[n].has_sinks))
    cls = BACKENDS.get(name)
    if cls is None:
        raise InvalidRequestError(f"unknown attention backend {name!r}; known: auto, {', '.join(sorted(BACKENDS))}",
                                  "attention_backend")
    why = cls.unsupported(kv, plan)
    if why is None and softcap is not None and not cls.has_softcap:
        why = "it has no attention logit soft-cap, which this model's layers use (paged_c and sdpa have)"
    if why is None and sinks is not None and not cls.has_sinks:
        why = "it has no attention sinks, which this model's layers use (paged_c and sdpa have)"
    if why:
        raise InvalidRequestError(f"attention backend {name}: {why}", "attention_backend")
    backend = cls()
    backend.softcap, backend.sinks = softcap, sinks
    return backend


class Attention(nn.Module):
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, backend: str = "auto",
                 sliding_window: int | None = None, scale: float | None = None, softcap: float | None = None,
                 sinks: bool = False):
        super().__init__()
        # GPT-OSS's per-head sink logits (the checkpoint's `self_attn.sinks`), fp32 whatever the model's dtype:
        # the kernels read them as they are
        self.sinks = nn.Parameter(torch.zeros(num_heads), requires_grad=False) if sinks else None
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = head_dim ** -0.5 if scale is None else scale
        self.softcap = softcap
        self.window = sliding_window
        self.backend_name = backend
        self.backend: AttentionBackend | None = None
        self.kv: LayerKV | None = None  # bound by the runner

    def bind(self, kv: LayerKV, plan: KernelPlan) -> None:
        self.kv = kv
        self.backend = resolve_backend(self.backend_name, kv, plan, self.softcap,
                                       None if self.sinks is None else self.sinks.data)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [T, H, D], k/v [T, Hkv, D] -> [T, H*D] in q's dtype."""
        ctx = get_forward_context()
        self.kv.write(ctx.for_kv_group(self.kv.kv_group)[0], k, v, ctx.positions)
        return self.attend(q)

    def attend(self, q: torch.Tensor) -> torch.Tensor:
        """q [T, H, D], with this step's K/V already in the cache -> [T, H*D] in q's dtype."""
        groups = get_forward_context().for_kv_group(self.kv.kv_group)[1]
        if len(groups) == 1:
            return self.backend(q, self.kv, groups[0], self.scale, self.window).to(q.dtype)
        out = q.new_empty(q.shape[0], self.num_heads * self.head_dim)
        for g in groups:
            out[g.rows] = self.backend(q[g.rows], self.kv, g, self.scale, self.window).to(q.dtype)
        return out
