"""`ngram` proposer (prompt lookup): propose the tokens that followed the most recent earlier
occurrence of the request's last n tokens, trying n from ngram_max down to ngram_min. No model:
it pays off where the output repeats its context (code editing, extraction, quoting). Each
request keeps an index from n-gram to the position where it last ended, extended incrementally,
so a step costs what is new, not the whole history."""
from __future__ import annotations

from collections.abc import Sequence

from ridgeline.engine.proposal import ProposalRequest, Proposer, register_proposer


class _Index:
    def __init__(self, sizes: range):
        self.sizes = sizes
        self.last_end: dict[tuple[int, ...], int] = {}  # n-gram -> position of its last token
        self.upto = 0  # n-grams ending before this position are indexed

    def extend(self, ids: Sequence[int], end: int) -> None:
        """Index every n-gram ending at positions [upto, end)."""
        for i in range(self.upto, end):
            for n in self.sizes:
                if i + 1 >= n:
                    self.last_end[tuple(ids[i + 1 - n:i + 1])] = i
        self.upto = max(self.upto, end)


@register_proposer("ngram")
class NgramProposer(Proposer):
    def __init__(self, config, vocab_size: int):
        super().__init__(config, vocab_size)
        self.sizes = range(config.ngram_max, config.ngram_min - 1, -1)
        self.indexes: dict[str, _Index] = {}

    def propose(self, requests: Sequence[ProposalRequest]) -> list[list[int]]:
        out = []
        for r in requests:
            ids, L = r.token_ids, len(r.token_ids)
            index = self.indexes.get(r.req_id)
            if index is None or index.upto > L:  # new, or shorter than indexed (recomputed from scratch)
                index = self.indexes[r.req_id] = _Index(self.sizes)
            index.extend(ids, L - 1)  # everything but the n-grams ending at the last token
            proposal: list[int] = []
            for n in self.sizes:
                if L >= n:
                    p = index.last_end.get(tuple(ids[L - n:]))
                    if p is not None:
                        proposal = list(ids[p + 1:p + 1 + r.k])
                        break
            out.append(proposal)
        return out

    def forget(self, req_ids: Sequence[str]) -> None:
        for rid in req_ids:
            self.indexes.pop(rid, None)
