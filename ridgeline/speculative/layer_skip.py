"""The `layer-skip` proposer (self-speculation by early exit): the draft is the target's own first L
layers, its final norm and its LM head. No weights of its own, and no KV cache of its own either:

The target's layers [0, L) already hold the KV of every verified token of a request, and they are
exactly what the draft attends to. So each pass feeds only new tokens through layers [0, L) of the
target, on the target's own cache and block table: first the request's last known token (position
n - 1, not computed yet), then each draft token in turn (positions n .. n + k - 2). Those writes land
at positions >= num_computed_tokens, which the target writes again before it ever reads them (its
verification step recomputes positions n - 1 .. n - 1 + proposals in every layer; a position past
that is computed later still); so after verification the KV of every accepted token is the target's
own, and a rejected draft leaves nothing behind. A block holding such positions is never a cached
(shared) one: only blocks full of computed tokens are cached or shared.

Before drafting, the request's table grows to hold positions up to n + k - 2, leaving the
scheduler's watermark free (the scheduler then needs those blocks anyway for the proposals; a table
it can't grow gets no draft this step). Drafts are the draft's argmax: a deterministic guess, exact
under the existing verification for greedy and random requests alike."""
from __future__ import annotations

from collections.abc import Sequence

import torch

from ridgeline.engine.kv_tier import store_now
from ridgeline.errors import InvalidRequestError
from ridgeline.layers.forward_context import forward_context
from ridgeline.engine.proposal import DraftTarget
from ridgeline.engine.proposal import DRAFT_GREEDY, ProposalRequest, Proposer, register_proposer
from ridgeline.step_plan import ScheduledSeq


@register_proposer("layer-skip")
class LayerSkipProposer(Proposer):
    needs_target = True

    def __init__(self, config, vocab_size: int, target: DraftTarget):
        super().__init__(config, vocab_size)
        self.runner, self.kv, self.reserve = target.runner, target.kv, target.reserve_blocks
        self.lm = self.runner.model
        num_layers = len(self.lm.model.layers)
        self.layers = config.speculative_layers
        if not 1 <= self.layers < num_layers:
            raise InvalidRequestError(f"speculative_layers must be in [1, {num_layers - 1}] for this model "
                                      f"({num_layers} layers; the draft runs the first L of them), got "
                                      f"{self.layers}", "speculative_layers")

    @torch.inference_mode()
    def propose(self, requests: Sequence[ProposalRequest]) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in requests]
        seqs, owners = [], []
        for i, r in enumerate(requests):
            n = len(r.token_ids)
            if self.kv.num_new_blocks(r.req_id, n + r.k - 1) and \
                    not self.kv.allocate(r.req_id, n + r.k - 1, reserve=self.reserve):
                continue  # no room to spare: no draft this step
            seqs.append(self._seq(r.req_id, n - 1, r.token_ids[-1]))
            owners.append(i)
        if seqs:  # blocks the growth evicted go to the KV tier before the drafts write into them
            store_now(self.kv, self.runner.store)
        while seqs:
            tokens = self._draft(seqs)
            nxt, nxt_owners = [], []
            for seq, i, token in zip(seqs, owners, tokens):
                out[i].append(token)
                if len(out[i]) < requests[i].k:
                    nxt.append(self._seq(seq.req_id, seq.start + 1, token))
                    nxt_owners.append(i)
            seqs, owners = nxt, nxt_owners
        return out

    def _seq(self, req_id: str, position: int, token: int) -> ScheduledSeq:
        table, more = self.kv.seq_tables(req_id)
        return ScheduledSeq(req_id, position, [token], table, True, DRAFT_GREEDY, None, None, 0, group_tables=more)

    def _draft(self, seqs: list[ScheduledSeq]) -> list[int]:
        """One token per sequence through layers [0, L), the final norm and the head -> the argmaxes."""
        ids, positions, ctx, _ = self.runner.prepare(seqs)
        model = self.lm.model
        with forward_context(ctx):
            hidden = model.run_layers(positions, model.embed(ids), None, 0, self.layers, final_norm=True)[0]
        return self.lm.compute_logits(hidden).argmax(-1).tolist()
