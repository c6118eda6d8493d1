"""The "h2o" attention backend: SDPA's math over the gathered blocks with the probabilities made
explicit, so that it can add the attention each cache slot receives (summed over heads and query
rows, and over layers as every layer adds into the same tensor) to the step's
`ForwardContext.attention`. Chosen by the engine for `--kv-eviction h2o` (engine/kv_eviction.py
ranks tokens by it); the C decoder stack does not run these layers."""
from __future__ import annotations

import numpy as np
import torch

from ridgeline.layers.attention import AttentionBackend, register_backend, sdpa_view
from ridgeline.layers.forward_context import get_forward_context
from ridgeline.quant.kv import hadamard
from ridgeline.step_plan import ScheduledSeq


@register_backend("h2o")
class AccumulatingSDPA(AttentionBackend):
    accumulates = True

    def __call__(self, q, kv, g, scale, window):
        B, Q = len(g.n), g.max_new
        _, bs, Hkv, _ = kv.k.shape
        H, D = q.shape[1:]
        G = H // Hkv
        q_index, mask, valid = sdpa_view(g, bs, G, window, q.device)
        qg = q[q_index] if valid is not None else q.view(B, Q, H, D)
        if kv.k_fmt.rotate:
            qg = hadamard(qg).to(q.dtype)
        qg = qg.view(B, Q, Hkv, G, D).transpose(1, 2).reshape(B, Hkv, Q * G, D)
        L = g.block_tables.shape[1] * bs
        k, v = kv.read(g.block_tables.view(-1), q.dtype)
        k, v = k.view(B, L, Hkv, D).transpose(1, 2), v.view(B, L, Hkv, D).transpose(1, 2)
        p = torch.softmax((qg @ k.transpose(-1, -2)).mul_(scale).masked_fill_(~mask, float("-inf")), dim=-1)
        acc = get_forward_context().attention
        if acc is not None:
            w = p.view(B, Hkv, Q, G, L)
            if valid is not None:  # padded query rows repeat a real one: count it once
                w = w * valid.view(B, 1, Q, 1, 1)
            slots = (g.block_tables.unsqueeze(-1) * bs + torch.arange(bs, device=q.device)).view(-1)
            acc.index_add_(0, slots, w.sum(dim=(1, 2, 3)).reshape(-1).to(acc.dtype))
        o = (p @ v).view(B, Hkv, Q, G, D).transpose(1, 2).reshape(B * Q, H, D)
        if kv.v_fmt.rotate:
            o = hadamard(o).to(q.dtype)
        o = o.reshape(B * Q, H * D)
        return o if valid is None else o[valid]


def slot_attention(acc: torch.Tensor, seqs: list[ScheduledSeq], bs: int) -> dict[str, np.ndarray]:
    """Request id -> attention its slots [0, kept + new) received this step, for sequences under eviction."""
    out = {}
    for s in seqs:
        if s.cache_start is None:
            continue
        idx = np.arange(s.cache_start + s.num_new)
        slots = np.asarray(s.block_table, np.int64)[idx // bs] * bs + idx % bs
        out[s.req_id] = acc[torch.from_numpy(slots).to(acc.device)].double().cpu().numpy()
    return out
