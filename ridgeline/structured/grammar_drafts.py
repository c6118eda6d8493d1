"""`grammar` proposer (lossless jump-forward): a constrained request's drafts are the tokens its
grammar forces next (a key and its quotes, a brace, the rest of an enum value once its first
letters decide it), read from the request's own Constraint (llguidance's fast-forward tokens). The
target verifies them like any deterministic proposal, so the output is exactly the masked model's
whatever the tokenization: where the model would have spelled the forced text with other tokens, the
first such draft is rejected and the model's token kept. Requests without structured outputs, and
positions where the grammar leaves a choice, get none. The engine's speculation drafts forced text
the same way before asking any proposer (engine/speculation.py), so `--speculative-method grammar` is
speculation on forced text alone; this proposer answers where it is asked directly. No model, no state: a draft costs the
matcher's fast-forward (microseconds), and the goodput controller prices it like any other."""
from __future__ import annotations

from collections.abc import Sequence

from ridgeline.engine.proposal import ProposalRequest, Proposer, register_proposer


@register_proposer("grammar")
class GrammarProposer(Proposer):
    def propose(self, requests: Sequence[ProposalRequest]) -> list[list[int]]:
        return [r.constraint.forced_tokens()[:r.k] if r.constraint is not None else [] for r in requests]
