"""Drafts drawn from the drafter's own distribution, for requests that sample (the EAGLE head's and
the draft model's).

A greedy request is verified against the target's argmax, so a drafter proposes its own most likely
token. A request that samples keeps a proposed token x with probability min(1, p(x) / q(x)); with
the argmax as a deterministic guess (q a point mass) that is p(x), often small at temperature 1 (on
the chat workload 19% of the EAGLE head's such drafts were kept, 53% for greedy requests). Drawing
x from the drafter's own distribution q instead keeps sum_x min(p(x), q(x)) on average, near 1
where the drafter matches the target. The verification (runner/rejection.py) is exact for any q it is
told, so q only moves acceptance: it is the drafter's softmax at the request's temperature, then
its top-k, min-p and top-p, as the target's are applied (penalties are not: they need the request's
history over the whole vocabulary); each proposer then shapes it (speculative/eagle.py mixes in its copy
pointer's pick, speculative/draft.py keeps the most likely tokens).

Whether a chain drafts position j is decided before x_j is drawn (from the distribution there,
never from x_j itself): a drawn token is always proposed, so each proposal is exactly a draw from
the q reported for it."""
from __future__ import annotations

import numpy as np
import torch

from ridgeline.sampling_params import GREEDY_EPSILON, SamplingParams

# Per row the distribution and the draw run in numpy on the host: a few operations on one row of
# draft-vocabulary logits, where each torch op right after the target's step costs tens of
# microseconds (the draws themselves come from torch generators, so seeds and torch.manual_seed
# keep their meaning).


def samples(params: SamplingParams | None) -> bool:
    return params is not None and not params.greedy


def draft_distribution(logits: np.ndarray, p: SamplingParams) -> np.ndarray:
    """One row of logits [V'] -> q [V'] float64 (sums to 1): temperature, top-k, min-p, top-p."""
    x = logits.astype(np.float64) / max(p.temperature, GREEDY_EPSILON)
    if 0 < p.top_k < x.size:
        x[x < np.partition(x, -p.top_k)[-p.top_k]] = -np.inf
    e = np.exp(x - x.max())
    q = e / e.sum()
    if p.min_p > 0:
        q[q < p.min_p * q.max()] = 0.0
    if p.top_p < 1:
        order = np.argsort(-q, kind="stable")
        sq = q[order]
        q[order[(np.cumsum(sq) - sq) >= p.top_p * sq.sum()]] = 0.0  # beyond the nucleus (its top always in)
    return q / q.sum()


def draw(q: np.ndarray, u: float) -> int:
    """The index whose cumulative share of q first exceeds u in [0, 1): a draw from q given u uniform."""
    cdf = np.cumsum(q)
    return min(int(np.searchsorted(cdf, u * cdf[-1], side="right")), q.size - 1)


def seed_generator(seed: int | None) -> torch.Generator | None:
    """The draws of a seeded request's drafts (None: torch's global generator), apart from its own."""
    if seed is None:
        return None
    return torch.Generator().manual_seed((seed * 1_000_003 + 0x5EA61E) % (1 << 63))
