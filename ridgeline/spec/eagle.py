"""The `eagle` proposer: a trained head (spec/eagle_head.py, `ridgeline train-draft`) drafts a chain of
k tokens from the target's hidden states, greedily (its argmax: a deterministic guess, so the
existing verification keeps the output exact for greedy and random requests alike).

The runner hands over the hidden state of every row it computed (`wants_hidden`). After each step,
`observe` keeps those of verified positions only (a prefill chunk's rows; a verification step's
rows up to the last accepted proposal), each with the token that follows it (for the last one, the
token the step sampled). Before the next draft, the head feeds a request's pending pairs through its
layer, appending to that request's K/V cache, and drafts from the feature of the last one: possible
when that pair is (hidden at n - 2, token n - 1), n the request's length. Positions the target did
not compute (a prefix-cache hit) are simply absent from the head's cache; a preempted request
recomputes positions the head already holds, which it skips (the tokens there never change). At
most MAX_PENDING rows wait per request (older ones are dropped: a gap, as for a cache hit), so a
request that drafts nothing for long costs bounded memory and a bounded catch-up."""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ridgeline.layers.linear import matmul_fn
from ridgeline.spec.draft_load import DraftTarget
from ridgeline.spec.eagle_io import head_rows, load_head
from ridgeline.spec.proposer import ProposalRequest, Proposer, register_proposer
from ridgeline.utils.device import pick_dtype

MAX_PENDING = 256
# How far a chain goes, by the head's confidence (its softmax over the draft vocabulary; EAGLE-2 sizes
# its draft trees by the same products). A first draft costs one verification row more: it is
# proposed when its probability reaches MIN_CONFIDENCE (on the bench's chat workload, first drafts
# below 0.1 matched the target 6% of the time, 15% of positions; 0.1-0.2: 18%; above 0.8: 93%). Each
# later one also costs a step of the head: proposed while the product of the chain's probabilities
# reaches MIN_PATH_CONFIDENCE (two-draft chains with a product below 0.1 were right in both drafts
# 7% of the time, 62% of them; 0.1-0.2: 14%; 0.2-0.3: 34%).
MIN_CONFIDENCE = 0.1
MIN_PATH_CONFIDENCE = 0.2


@dataclass
class _State:
    cache: tuple[torch.Tensor, torch.Tensor]  # the head's K, V of positions fed so far
    next_pos: int = 0  # positions < next_pos are fed (or skipped)
    feat: torch.Tensor | None = None  # [H] the head's feature at next_pos - 1
    pending: list[tuple[int, torch.Tensor, list[int]]] = field(default_factory=list)  # (pos, hidden [n, H], next ids)
    num_pending: int = 0  # rows in pending

    def add(self, start: int, hidden: torch.Tensor, nxt: list[int]) -> None:
        """Queue rows, keeping the newest MAX_PENDING (a cut through the oldest entry keeps its tail)."""
        self.pending.append((start, hidden, nxt))
        self.num_pending += hidden.shape[0]
        while self.num_pending > MAX_PENDING:
            start, h, ids = self.pending[0]
            cut = min(h.shape[0], self.num_pending - MAX_PENDING)
            self.pending[0] = (start + cut, h[cut:], ids[cut:])
            if cut == h.shape[0]:
                self.pending.pop(0)
            self.num_pending -= cut

    def clear(self) -> None:
        self.pending.clear()
        self.num_pending = 0


@register_proposer("eagle")
class EagleProposer(Proposer):
    needs_target = True
    wants_hidden = True

    def __init__(self, config, vocab_size: int, target: DraftTarget):
        super().__init__(config, vocab_size)
        self.lm, self.device = target.runner.model, target.device
        head, vocab_ids, self.head_config = load_head(config.draft_model, self.lm)
        self.vocab_ids = None if vocab_ids is None else vocab_ids.to(target.device)
        rows = head_rows(self.lm, self.vocab_ids)
        # On a CPU the head's matmuls (and its LM-head rows) run in the engine's own packed kernels,
        # in the target's weight dtype: torch's small matmuls right after the
        # decoder stack's step ran 4-6x slower than alone (its thread pool and the stack's contend
        # for the two cores, and the head's weights come back from memory). Elsewhere the head
        # drafts in torch, in the target's activation dtype where that is bf16 and bf16 is native.
        # Drafts are guesses: their precision never changes the verified output.
        plan = self.lm.model.plan
        if target.device.type == "cpu" and target.dtype in plan.packed:
            def pack(w):  # the head's weight in the target's dtype, multiplied as the target's dense layers are
                return matmul_fn(w.to(target.dtype).contiguous(), plan)
            self.dtype = torch.float32
            self.head = head.to(target.device)
            self.head.use_kernels(pack)
            self._rows_mm = None if rows is None else pack(rows)
        else:
            self.dtype = torch.bfloat16 if (target.act_dtype == torch.bfloat16 and pick_dtype(
                "auto", target.device).dtype == torch.bfloat16) else torch.float32
            self.head = head.to(target.device, self.dtype)
            rows = None if rows is None else rows.to(self.dtype)
            self._rows_mm = None if rows is None else (lambda x, r=rows: x @ r.T)
        self.states: dict[str, _State] = {}

    def observe(self, plan, sampled, hidden: torch.Tensor, requests: dict) -> None:
        """After a step: keep the hidden states of its verified positions, each with its next token."""
        kept = {s.req_id: s for s in sampled}
        row = 0
        for seq in plan.seqs:
            n, start = seq.num_new, seq.start
            s = kept.get(seq.req_id)
            if s is not None:
                valid = n - seq.num_spec + s.accepted
                nxt = seq.token_ids[1:valid] + [s.token_ids[-1]]
            else:
                valid = n
                nxt = seq.token_ids[1:] + [requests[seq.req_id].token_ids[start + n]]
            st = self.states.get(seq.req_id)
            if st is None:
                st = self.states[seq.req_id] = _State(self.head.empty_cache())
            if start + valid > st.next_pos:
                st.add(start, hidden[row:row + valid].clone(), nxt)
            row += n

    @torch.inference_mode()
    def propose(self, requests: Sequence[ProposalRequest]) -> list[list[int]]:
        states = [self.states.get(r.req_id) for r in requests]
        t0 = time.perf_counter()
        rows = self._catch_up([st for st in states if st is not None and st.pending])
        # rows past a verification's worth per request (k + 1) are a prompt or a gap caught up once
        steady = sum(r.k + 1 for r in requests)
        self.setup_time = (time.perf_counter() - t0) * max(0, rows - steady) / rows if rows else 0.0
        out: list[list[int]] = [[] for _ in requests]
        live = [i for i, (r, st) in enumerate(zip(requests, states))
                if st is not None and st.feat is not None and st.next_pos == len(r.token_ids) - 1]
        if not live:
            return out
        feats = torch.stack([states[i].feat for i in live])
        caches = [states[i].cache for i in live]
        positions = torch.tensor([len(requests[i].token_ids) - 1 for i in live], device=self.device)
        k_max = max(requests[i].k for i in live)
        stopped, path = [False] * len(live), [1.0] * len(live)
        for step in range(k_max):
            tokens, probs = self._argmax(feats)
            for n, (i, t, p) in enumerate(zip(live, tokens.tolist(), probs.tolist())):
                path[n] *= p
                bar = MIN_CONFIDENCE if step == 0 else MIN_PATH_CONFIDENCE
                stopped[n] = stopped[n] or path[n] < bar or step >= requests[i].k
                if not stopped[n]:
                    out[i].append(t)
            if step + 1 == k_max or all(stopped):
                break
            feats, caches = self.head.step(feats, self.lm.model.embed(tokens).to(self.dtype), positions + step,
                                           caches, [1] * len(live))
        return out

    def _catch_up(self, states: list[_State]) -> int:
        """Feed every pending (hidden, next token) pair of these requests through the head, in one
        call; returns how many rows that was."""
        hs, ids, pos, counts = [], [], [], []
        for st in states:
            n = 0
            for start, h, nxt in st.pending:
                skip = max(0, st.next_pos - start)
                if skip < h.shape[0]:
                    hs.append(h[skip:])
                    ids += nxt[skip:]
                    pos.extend(range(start + skip, start + h.shape[0]))
                    n += h.shape[0] - skip
                    st.next_pos = start + h.shape[0]
            st.clear()
            counts.append(n)
        if not hs:
            return 0
        emb = self.lm.model.embed(torch.tensor(ids, device=self.device)).to(self.dtype)
        feats, caches = self.head.step(torch.cat(hs).to(self.dtype), emb,
                                       torch.tensor(pos, device=self.device),
                                       [st.cache for st in states], counts)
        end = 0
        for st, cache, n in zip(states, caches, counts):
            end += n
            st.cache = cache
            if n:
                st.feat = feats[end - 1]
        return sum(counts)

    def _argmax(self, feats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (the head's most likely token per row, its probability over the rows drafted from)."""
        if self._rows_mm is None:
            logits = self.lm.compute_logits(feats.to(self.lm.model.act_dtype)).float()
        else:
            logits = self._rows_mm(feats).float()
        top, idx = logits.max(-1)
        prob = (top - torch.logsumexp(logits, -1)).exp()
        return (idx if self._rows_mm is None else self.vocab_ids[idx]), prob

    def forget(self, req_ids: Sequence[str]) -> None:
        for rid in req_ids:
            self.states.pop(rid, None)
