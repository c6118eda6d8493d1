"""The "sdpa-scores-int8" attention backend: SDPA's math over the gathered blocks with the softmax
inputs (the scaled scores q.k / sqrt(d)) rounded to int8 first, one symmetric scale per query row
and head (max |score| over the keys it may attend to / 127), as an attention kernel that keeps its
scores in 8 bits would. It exists to measure what quantizing attention scores costs (`ridgeline eval
--sweep`, the "attention scores" component), not to run fast: the C decoder stack does not run
these layers (start-up says so), and the math is dense torch."""
from __future__ import annotations

import torch

from ridgeline.layers.attention import AttentionBackend, gather_attention, register_backend


def quantize_scores(s: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """s [..., L] fp32 scores, allowed [..., L] bool (broadcastable) -> s rounded to int8 per row:
    a = max |s| over the allowed keys / 127, round(s / a) * a; rows with no allowed key unchanged."""
    mx = s.abs().masked_fill(~allowed, 0).amax(-1, keepdim=True)
    a = mx / 127
    return torch.where(a > 0, torch.round(s / torch.where(a > 0, a, torch.ones_like(a))) * a, s)


@register_backend("sdpa-scores-int8")
class Int8ScoresSDPA(AttentionBackend):
    def __call__(self, q, kv, g, scale, window):
        a = gather_attention(q, kv, g, window)
        s = quantize_scores((a.qg @ a.k.transpose(-1, -2)).mul_(scale), a.mask)
        p = torch.softmax(s.masked_fill_(~a.mask, float("-inf")), dim=-1)
        return a.output(p @ a.v, kv, q.dtype)
