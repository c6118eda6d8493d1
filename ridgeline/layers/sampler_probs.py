"""The distribution the Sampler draws a random row from, as probabilities: penalties, temperature,
then the kept set of top-k / top-p / min-p exactly as `Sampler._sample` decides it (sorted
descending; top_p a fraction of the top-k mass when top_k is set; min_p relative to the row's
largest probability; the most likely token always kept). Speculative verification needs these
numbers, p(token) and the residual max(p - q, 0), where plain sampling only needs a draw."""
from __future__ import annotations

import torch

from ridgeline.layers.sampler import SamplingMetadata, apply_penalties


def kept_probs(logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
    """logits [B, V] float32 (scratch: penalised in place), meta built for these B rows, all random
    (no greedy row) -> [B, V] float32 probabilities, each row summing to 1."""
    assert len(meta.greedy_rows) == 0, "greedy rows are verified by their argmax, not by probabilities"
    apply_penalties(logits, meta)
    x = logits.div_(meta.temperature[:, None])
    x.sub_(x.amax(-1, keepdim=True)).exp_()  # unnormalised, row max == 1, as the race sees it
    keep = x >= meta.min_p[:, None]
    top_k, top_p = meta.top_k, meta.top_p
    ranked = ((top_k > 0) | (top_p < 1)).nonzero()[:, 0]
    if len(ranked):
        _rank_mask(x, keep, ranked, top_k[ranked], top_p[ranked])
    keep[torch.arange(len(x), device=x.device), x.argmax(-1)] = True
    x.mul_(keep)
    return x.div_(x.sum(-1, keepdim=True))


def _rank_mask(x: torch.Tensor, keep: torch.Tensor, rows: torch.Tensor, top_k: torch.Tensor,
               top_p: torch.Tensor) -> None:
    """Narrow keep[rows] to each row's top-k / top-p prefix of its tokens sorted by probability."""
    V = x.shape[1]
    width = torch.where(top_k > 0, top_k.clamp(max=V), V)
    cand, cand_ids = x[rows].topk(int(width.max()), -1)  # descending
    inside = torch.arange(cand.shape[1], device=x.device) < width[:, None]
    base = torch.where(top_k > 0, (cand * inside).sum(-1), x[rows].sum(-1))
    csum = cand.cumsum(-1)
    prefix = inside & ((csum - cand < (top_p * base)[:, None]) | (top_p[:, None] >= 1))
    prefix[:, 0] = True
    mask = torch.zeros(len(rows), V, dtype=torch.bool, device=x.device).scatter_(1, cand_ids, prefix)
    keep[rows] &= mask
