"""The "h2o" attention backend: SDPA's math over the gathered blocks with the probabilities made
explicit, so that it can add the attention each cache slot receives (summed over heads and query
rows, and over layers as every layer adds into the same tensor) to the step's
`ForwardContext.attention`. Chosen by the engine for `--kv-eviction h2o` (engine/kv_eviction.py
ranks tokens by it); the C decoder stack does not run these layers."""
from __future__ import annotations

import numpy as np
import torch

from ridgeline.layers.attention import AttentionBackend, gather_attention, register_backend
from ridgeline.layers.forward_context import get_forward_context
from ridgeline.step_plan import ScheduledSeq


@register_backend("h2o")
class AccumulatingSDPA(AttentionBackend):
    accumulates = True

    def __call__(self, q, kv, g, scale, window):
        a = gather_attention(q, kv, g, window)
        p = torch.softmax((a.qg @ a.k.transpose(-1, -2)).mul_(scale).masked_fill_(~a.mask, float("-inf")), dim=-1)
        acc = get_forward_context().attention
        if acc is not None:
            B, Hkv, _, L = p.shape
            w = p.view(B, Hkv, a.Q, a.G, L)
            if a.valid is not None:  # padded query rows repeat a real one: count it once
                w = w * a.valid.view(B, 1, a.Q, 1, 1)
            bs = kv.k.shape[1]
            slots = (g.block_tables.unsqueeze(-1) * bs + torch.arange(bs, device=q.device)).view(-1)
            acc.index_add_(0, slots, w.sum(dim=(1, 2, 3)).reshape(-1).to(acc.dtype))
        return a.output(p @ a.v, kv, q.dtype)


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
