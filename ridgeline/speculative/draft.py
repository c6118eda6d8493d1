"""The `draft` proposer: a smaller model (or the target's own weights, quantized) drafts k tokens
greedily for every decoding request, in k forward passes over the whole batch, with its own paged
KV cache and runner in the target's process.

Per request it remembers the tokens whose KV it holds (`fed`). Before drafting, that list is cut to
its common prefix with the request's tokens (the target rejected what follows, or the request was
preempted and resumed: its tokens stay the same), the tail blocks are released, and the first pass
feeds what is missing (the prompt, or the target's last accepted and sampled tokens) and yields the
first draft token; each further pass feeds the previous draft token. For a greedy request the drafts
are the draft's argmax, kept while they equal the target's. For a request that samples they are
drawn from the draft's own distribution q at the request's temperature, top-k, min-p and top-p
(speculative/sampled_drafts.py), its TOP_Q most likely tokens (renormalized: so q is exactly what is drawn
from), returned as a Draft and verified against q by rejection sampling: a draft close to the target
(the target's own weights quantized) is then kept about as often as at temperature 0, where its
argmax would be kept only with the target's probability of it. A request whose blocks do not fit the
draft's cache gets no draft this step, never an error."""
from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import torch

from ridgeline.engine.kv_manager import KVCacheManager
from ridgeline.kv_spec import KV_FORMATS, KVCacheSpec
from ridgeline.runner.model_runner import ModelRunner
from ridgeline.engine.proposal import DraftTarget
from ridgeline.speculative.draft_load import load_draft_model
from ridgeline.speculative.sampled_drafts import draft_distribution, draw, samples, seed_generator
from ridgeline.engine.proposal import DRAFT_GREEDY, ProposalRequest, Proposer, register_proposer
from ridgeline.runner.draft import Draft
from ridgeline.step_plan import ScheduledSeq, StepPlan

TOP_Q = 256  # a sampled draft's q keeps the draft's this many most likely tokens


@register_proposer("draft")
class DraftProposer(Proposer):
    needs_target = True

    def __init__(self, config, vocab_size: int, target: DraftTarget):
        super().__init__(config, vocab_size)
        arch, model = load_draft_model(config, target, vocab_size)
        self.model = model
        kv_spec = KVCacheSpec(KV_FORMATS[target.kv_format], arch.num_layers, arch.num_kv_heads, arch.head_dim,
                              target.block_size)
        self.kv = KVCacheManager(target.num_blocks, target.block_size)
        self.runner = ModelRunner(model, arch, target.device, kv_spec, target.num_blocks, list(target.eos_ids))
        self.fed: dict[str, list[int]] = {}  # request id -> tokens whose KV the draft holds, in order
        self.runner.keep_hidden = True  # a sampled draft's q comes from its rows' logits
        self.gens: dict[str, torch.Generator] = {}  # seeded sampling requests' draft draws
        self.q_rows: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}

    def propose(self, requests: Sequence[ProposalRequest]) -> list[list[int] | Draft]:
        out: list[list[int] | Draft] = [[] for _ in requests]
        seqs, owners = [], []
        for i, r in enumerate(requests):
            seq = self._first_pass(r)
            if seq is not None:
                seqs.append(seq)
                owners.append(i)
        seqs, owners = _decodes_first(seqs, owners)
        self.q_rows = {i: [] for i in owners if samples(requests[i].params)}
        for seq, i in zip(seqs, owners):  # a sampling request's token is drawn here, not by the runner
            seq.sample = i not in self.q_rows
        self.setup_time, self.setup_rows = 0.0, 0
        for step in range(max((requests[i].k for i in owners), default=0)):
            if not seqs:
                break
            t0 = time.perf_counter()
            result = self.runner.execute(StepPlan(seqs))
            if step == 0:  # rows past a verification's worth per request (k + 1): a prompt caught up once
                rows, steady = sum(q.num_new for q in seqs), sum(requests[i].k + 1 for i in owners)
                self.setup_rows = max(0, rows - steady)
                self.setup_time = (time.perf_counter() - t0) * self.setup_rows / rows
            drawn = self._draw(seqs, owners, requests, result.hidden) if self.q_rows else {}
            argmax = iter(result.sampled)  # the greedy requests' (runner-sampled) seqs, in order
            nxt, nxt_owners = [], []
            for seq, i in zip(seqs, owners):
                token = drawn[i] if i in drawn else next(argmax).token_ids[0]
                out[i].append(token)
                fed = self.fed[seq.req_id]
                fed.extend(seq.token_ids)
                if len(out[i]) < requests[i].k:  # feed this draft token next (its slot is allocated)
                    nxt.append(ScheduledSeq(seq.req_id, len(fed), [token], list(self.kv.tables[seq.req_id]),
                                            i not in self.q_rows, DRAFT_GREEDY, None, None, 0))
                    nxt_owners.append(i)
            seqs, owners = _decodes_first(nxt, nxt_owners)
        for i, rows in self.q_rows.items():
            if rows:
                out[i] = Draft(out[i], torch.from_numpy(np.stack([q for q, _ in rows])).to(self.runner.device),
                               torch.from_numpy(np.stack([ids for _, ids in rows])).to(self.runner.device))
        return out

    def _draw(self, seqs: list[ScheduledSeq], owners: list[int], requests: Sequence[ProposalRequest],
              hidden: torch.Tensor) -> dict[int, int]:
        """For the sampling requests of this pass: a token drawn from q (the draft's distribution at
        each one's sampling parameters, on its TOP_Q most likely tokens) at its last row; q kept."""
        rows, who, end = [], [], 0
        for seq, i in zip(seqs, owners):
            end += seq.num_new
            if i in self.q_rows:
                rows.append(end - 1)
                who.append(i)
        if not rows:
            return {}
        logits = self.model.compute_logits(hidden[rows]).float().cpu().numpy()
        drawn = {}
        for lg, i in zip(logits, who):
            r = requests[i]
            gen = self.gens.get(r.req_id)
            if gen is None and r.seed is not None:
                gen = self.gens[r.req_id] = seed_generator(r.seed)
            h = draft_distribution(lg, r.params)
            top = np.argpartition(h, -TOP_Q)[-TOP_Q:] if h.size > TOP_Q else np.arange(h.size)
            q = h[top] / h[top].sum()
            j = draw(q, float(torch.rand(1, generator=gen)))
            drawn[i] = int(top[j])
            self.q_rows[i].append((q.astype(np.float32), top.astype(np.int64)))
        return drawn

    def _first_pass(self, r: ProposalRequest) -> ScheduledSeq | None:
        """The request's tokens the draft has not computed, ending in its last one; None if its blocks
        (every token, plus k - 1 draft tokens) do not fit."""
        tokens = r.token_ids
        fed = self.fed.setdefault(r.req_id, [])
        # a request's tokens only grow, and fed departs from them only by the draft tokens of the last
        # step past the first (fewer than k <= 64): only that tail needs comparing
        keep = min(_common_prefix(fed, tokens, max(0, len(fed) - 65)), len(tokens) - 1)  # the last is fed again
        del fed[keep:]
        self.kv.shrink(r.req_id, keep)
        if not self.kv.allocate(r.req_id, len(tokens) + r.k - 1):
            self.forget([r.req_id])
            return None
        return ScheduledSeq(r.req_id, keep, list(tokens[keep:]), list(self.kv.tables[r.req_id]), True, DRAFT_GREEDY,
                            None, None, 0)

    def backlog(self, req_id: str, num_tokens: int) -> int:
        """The request's tokens whose KV the draft model does not hold yet."""
        return max(0, num_tokens - len(self.fed.get(req_id, ())))

    def forget(self, req_ids: Sequence[str]) -> None:
        for rid in req_ids:
            self.fed.pop(rid, None)
            self.gens.pop(rid, None)
            self.kv.free(rid)
        self.runner.sample.forget(list(req_ids))


def _common_prefix(a: Sequence[int], b: Sequence[int], start: int = 0) -> int:
    """Length of the common prefix of a and b, given that their first `start` items are equal."""
    n = min(len(a), len(b))
    i = min(start, n)
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _decodes_first(seqs: list[ScheduledSeq], owners: list[int]) -> tuple[list[ScheduledSeq], list[int]]:
    """The runner takes decodes before the rest (already so after the first pass)."""
    order = sorted(range(len(seqs)), key=lambda i: not seqs[i].is_decode)
    return [seqs[i] for i in order], [owners[i] for i in order]
