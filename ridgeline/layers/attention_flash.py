"""The "flash" attention backend (CUDA): FlashAttention-2's variable-length kernel, as torch ships it
(`aten._flash_attention_forward`), over each sequence's keys gathered from its blocks.

A step's group packs its sequences end to end: queries q [sum n_i, H, D] in row order, keys and
values [sum L_i, Hkv, D] with L_i = start_i + n_i (the cached prefix, then this step's tokens). The
kernel's causal mask is aligned to the bottom right (query j of sequence i sees keys up to
start_i + j), which is what a chunk after a prefix-cache hit or an earlier chunk needs; a sliding
window of W keys is window_size_left = W - 1. GQA heads share K/V inside the kernel (no repeat).
No padded rows and no mask tensor: SDPA with the explicit mask the "sdpa" backend builds runs the
memory-efficient kernel instead of flash, and pads every sequence to the longest.

Where the kernel cannot run (a CPU, a quantized or rotated cache, fp32) the backend reports why and
"auto" picks another. `varlen_reference` is the same computation in plain torch (tests run the
gather and packing on a CPU through it).
"""
from __future__ import annotations

import numpy as np
import torch

from ridgeline.layers.attention import AttentionBackend, register_backend
from ridgeline.layers.forward_context import AttnGroup
from ridgeline.layers.kv_cache import LayerKV
from ridgeline.layers.kernel_plan import KernelPlan
from ridgeline.utils.device import nvidia_sm80


def _flash_op():
    return getattr(torch.ops.aten, "_flash_attention_forward", None)


@register_backend("flash")
class FlashVarlen(AttentionBackend):
    @staticmethod
    def unsupported(kv: LayerKV, plan: KernelPlan) -> str | None:
        if kv.k.device.type != "cuda":
            return "FlashAttention's kernel needs a CUDA device"
        if not nvidia_sm80(kv.k.device):
            return "FlashAttention-2 needs an NVIDIA GPU of compute capability 8.0 or newer"
        if _flash_op() is None:
            return "this torch has no aten._flash_attention_forward"
        if (kv.k.dtype not in (torch.float16, torch.bfloat16) or kv.k_scale is not None or kv.v_scale is not None
                or kv.k_fmt.rotate or kv.v_fmt.rotate or kv.k_centers is not None):
            return f"it reads float16 / bfloat16 caches only, not {kv.formats} ({kv.k.dtype})"
        D = kv.k.shape[-1]
        if D % 8 or D > 256:
            return f"head_dim {D}: FlashAttention needs a multiple of 8, at most 256"
        return None

    def __call__(self, q, kv, g, scale, window):
        slots, cu_q, cu_k, max_q, max_k = flash_view(g, kv.block_size, q.device)
        _, _, Hkv, D = kv.k.shape
        k = kv.k.view(-1, Hkv, D).index_select(0, slots)  # [sum L_i, Hkv, D]
        v = kv.v.view(-1, Hkv, D).index_select(0, slots)
        o = varlen(q.to(k.dtype).contiguous(), k, v, cu_q, cu_k, max_q, max_k, scale, window)
        return o.reshape(q.shape[0], -1)


def flash_view(g: AttnGroup, bs: int, device: torch.device):
    """(slots [sum L_i] flat cache slot of every key of every sequence, in order; cu_q, cu_k [B + 1]
    int32 cumulative query and key counts; max_q, max_k), built once per group and step."""
    key = ("flash", bs)
    if key not in g.derived:
        n = g.n.astype(np.int64)
        L = g.start.astype(np.int64) + n
        seq = np.repeat(np.arange(len(L)), L)
        pos = np.arange(int(L.sum())) - np.repeat(np.cumsum(L) - L, L)
        seq_t, pos_t = torch.from_numpy(seq).to(device), torch.from_numpy(pos).to(device)
        slots = g.block_tables[seq_t, pos_t // bs] * bs + pos_t % bs
        cu_q = torch.from_numpy(np.concatenate([[0], np.cumsum(n)]).astype(np.int32)).to(device)
        cu_k = torch.from_numpy(np.concatenate([[0], np.cumsum(L)]).astype(np.int32)).to(device)
        g.derived[key] = (slots, cu_q, cu_k, int(n.max()), int(L.max()))
    return g.derived[key]


def varlen(q, k, v, cu_q, cu_k, max_q: int, max_k: int, scale: float, window: int | None) -> torch.Tensor:
    """q [Tq, H, D], k/v [Tk, Hkv, D] packed by sequence -> [Tq, H, D], causal from the bottom right."""
    if not q.is_cuda:
        return varlen_reference(q, k, v, cu_q, cu_k, scale, window)
    out = _flash_op()(q, k, v, cu_q, cu_k, max_q, max_k, 0.0, True, False, scale=scale,
                      window_size_left=window - 1 if window else None, window_size_right=0 if window else None)
    return out[0]


def varlen_reference(q, k, v, cu_q, cu_k, scale: float, window: int | None) -> torch.Tensor:
    """What the flash kernel computes, one sequence at a time in fp32 (tests and CPUs)."""
    H, Hkv = q.shape[1], k.shape[1]
    out = torch.empty_like(q)
    for i in range(len(cu_q) - 1):
        q0, q1, k0, k1 = int(cu_q[i]), int(cu_q[i + 1]), int(cu_k[i]), int(cu_k[i + 1])
        Q, L = q1 - q0, k1 - k0
        qi = q[q0:q1].float().transpose(0, 1)  # [H, Q, D]
        ki = k[k0:k1].float().transpose(0, 1).repeat_interleave(H // Hkv, 0)  # [H, L, D]
        vi = v[k0:k1].float().transpose(0, 1).repeat_interleave(H // Hkv, 0)
        pos = torch.arange(Q)[:, None] + (L - Q)  # each query's position
        keys = torch.arange(L)[None, :]
        allowed = keys <= pos
        if window:
            allowed &= keys > pos - window
        s = (qi @ ki.transpose(1, 2)) * scale
        s = s.masked_fill(~allowed.to(s.device), float("-inf"))
        out[q0:q1] = (torch.softmax(s, -1) @ vi).transpose(0, 1).to(q.dtype)
    return out
