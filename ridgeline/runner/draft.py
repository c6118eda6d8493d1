"""A proposal with its draft distribution: what rejection sampling verifies (runner/rejection.py).

A proposer (engine/proposal.py) gives plain token ids (a deterministic guess: kept while it equals
what the target samples) or a Draft: tokens sampled from a draft distribution q, given with q itself,
so that verification can accept each with probability min(1, p/q) and resample from max(p - q, 0) on
the first rejection."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Draft:
    """Proposed tokens sampled from a draft distribution q, and q: for proposed token j, probs[j]
    over ids[j] (the tokens the draft could have drawn; q is 0 elsewhere) or, with ids None, probs[j]
    over the whole vocabulary. Tensors: probs [n, m] float32 (rows sum to 1), ids [n, m] int64, with
    n >= len(token_ids). Each token must have been drawn from its row (q(token) > 0). Only the rows
    verified this step are held, so memory stays bounded by the step."""
    token_ids: list[int]
    probs: Any = None
    ids: Any = None

    def on(self, device) -> "Draft":
        """This draft with q on `device` (the target's logits'): a proposer may build q elsewhere."""
        if self.probs is None or self.probs.device == device:
            return self
        ids = None if self.ids is None else self.ids.to(device)
        return Draft(self.token_ids, self.probs.to(device), ids)

    def q_at(self, tokens) -> Any:
        """tokens [k] int64 tensor (k <= rows) -> [k] float32: q_j(tokens[j])."""
        k = len(tokens)
        if self.ids is None:
            return self.probs[:k].gather(1, tokens[:, None])[:, 0]
        return (self.probs[:k] * (self.ids[:k] == tokens[:, None])).sum(-1)

    def subtract_row(self, j: int, w) -> None:
        """w [V] -= q_j, in place."""
        if self.ids is None:
            w.sub_(self.probs[j])
        else:
            w.index_add_(0, self.ids[j], -self.probs[j])
