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
from ridgeline.spec.eagle_pointer import CopyPointer, draft_vocab_index, pick
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
    # (pos, hidden [n, H], the n + 1 tokens at positions pos .. pos + n: each row's own and next)
    pending: list[tuple[int, torch.Tensor, list[int]]] = field(default_factory=list)
    num_pending: int = 0  # rows in pending
    # the copy pointer's (heads that have one): keys of fed positions [m, d], those positions [m], the
    # tokens that followed them (x_{j+2}, filled as known: all but the last), the last position's u [4H]
    keys: torch.Tensor | None = None
    key_pos: list[int] = field(default_factory=list)
    payload: torch.Tensor | None = None
    last_u: torch.Tensor | None = None

    def add(self, start: int, hidden: torch.Tensor, toks: list[int]) -> None:
        """Queue rows, keeping the newest MAX_PENDING (a cut through the oldest entry keeps its tail)."""
        self.pending.append((start, hidden, toks))
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
        self.vocab_index = draft_vocab_index(self.vocab_ids, vocab_size)  # for the copy pointer's mixture
        rows = head_rows(self.lm, self.vocab_ids)
        # On a CPU the head's matmuls (and its LM-head rows) run in the engine's own packed kernels,
        # in the target's weight dtype: torch's small matmuls right after the
        # decoder stack's step ran 4-6x slower than alone (its thread pool and the stack's contend
        # for the two cores, and the head's weights come back from memory). Elsewhere the head
        # drafts in torch, in the target's activation dtype where that is bf16 and bf16 is native.
        # Drafts are guesses: their precision never changes the verified output.
        plan = self.lm.model.plan
        if target.device.type == "cpu" and target.dtype in plan.packed:
            # int8 (per-channel, as `--quantization int8` rounds a checkpoint) where its kernel runs: a
            # draft step reads the head's layer and its LM-head rows from memory, and int8 halves them
            fmt = "int8" if "int8" in plan.quant else None
            if fmt:
                import ridgeline.quant.formats  # noqa: F401  (registers the int8 weight format)

            def pack(w):  # the head's weight multiplied as the target's dense (or int8) layers are
                return matmul_fn(w.to(target.dtype).contiguous(), plan, fmt)
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
        self.pointer: CopyPointer | None = self.head.pointer
        self._scratch = torch.zeros(vocab_size, device=target.device)  # pick()'s, kept zero
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
                toks = seq.token_ids[:valid] + [s.token_ids[-1]]
            else:
                valid = n
                toks = seq.token_ids[:n] + [requests[seq.req_id].token_ids[start + n]]
            st = self.states.get(seq.req_id)
            if st is None:
                st = self.states[seq.req_id] = _State(self.head.empty_cache())
            if start + valid > st.next_pos:
                st.add(start, hidden[row:row + valid].clone(), toks)
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
        copy = self._copy_context([requests[i] for i in live], [states[i] for i in live])
        if copy is not None:  # the embedding of each chain position's own token (the request's last, then drafts)
            prev_emb = self.lm.model.embed(torch.tensor([requests[i].token_ids[-1] for i in live],
                                                        device=self.device)).to(self.dtype)
        stopped, path = [False] * len(live), [1.0] * len(live)
        for step in range(k_max):
            tokens, probs = self._draft(feats, copy)
            for n, (i, t, p) in enumerate(zip(live, tokens.tolist(), probs.tolist())):
                path[n] *= p
                bar = MIN_CONFIDENCE if step == 0 else MIN_PATH_CONFIDENCE
                stopped[n] = stopped[n] or path[n] < bar or step >= requests[i].k
                if not stopped[n]:
                    out[i].append(t)
                # no step of the head for a chain whose next draft could not pass the bar
                stopped[n] = stopped[n] or path[n] < MIN_PATH_CONFIDENCE or step + 1 >= requests[i].k
            if step + 1 == k_max or all(stopped):
                break
            emb = self.lm.model.embed(tokens).to(self.dtype)
            new_feats, caches = self.head.step(feats, emb, positions + step, caches, [1] * len(live))
            if copy is not None:  # the new position's u; its key joins once the token after it is drafted
                us = CopyPointer.describe(emb, prev_emb, feats, new_feats)
                prev_emb = emb
                keys = self.pointer.key(us)
                copy = [(torch.cat([kk, keys[n:n + 1]]), torch.cat([pay, tokens[n:n + 1]]), us[n])
                        for n, (kk, pay, _) in enumerate(copy)]
            feats = new_feats
        return out

    def _copy_context(self, requests: list[ProposalRequest], states: list[_State]) -> list | None:
        """Per request: (pointer keys, the tokens that followed their positions, the query position's
        u); keys past len(tokens) have no known token yet. None: the head has no pointer."""
        if self.pointer is None:
            return None
        out = []
        for r, st in zip(requests, states):
            n, have = len(r.token_ids), 0 if st.payload is None else st.payload.shape[0]
            known = sum(1 for p in st.key_pos[have:] if p + 2 < n)  # positions increase: a prefix of the rest
            if known or st.payload is None:
                new = torch.tensor([r.token_ids[p + 2] for p in st.key_pos[have:have + known]], dtype=torch.long,
                                   device=self.device)
                st.payload = new if st.payload is None else torch.cat([st.payload, new])
            out.append((st.keys, st.payload, st.last_u))
        return out

    def _draft(self, feats: torch.Tensor, copy: list | None) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (each row's draft token, its probability): the head's most likely token, or with a copy
        pointer the mixture's (eagle_pointer.pick)."""
        probs = self._head_probs(feats)
        probs_top, itop = probs.max(-1)
        tokens = itop if self.vocab_ids is None else self.vocab_ids[itop]
        if copy is None:
            return tokens, probs_top
        tokens, ptop = tokens.tolist(), probs_top.tolist()
        q = self.pointer.query(torch.stack([u for _, _, u in copy]))
        for n, (keys, pay, _) in enumerate(copy):
            if pay.numel():
                a, g = self.pointer.attend(q[n:n + 1], keys[:pay.numel()], None, feats[n:n + 1], probs_top[n:n + 1])
                tokens[n], ptop[n] = pick(a[0], float(g[0]), pay, probs[n], self.vocab_index, (tokens[n], ptop[n]),
                                          self._scratch)
        return torch.tensor(tokens, device=self.device), torch.tensor(ptop)

    def _catch_up(self, states: list[_State]) -> int:
        """Feed every pending (hidden, next token) pair of these requests through the head, in one
        call; returns how many rows that was."""
        hs, ids, own, pos, counts = [], [], [], [], []
        for st in states:
            n = 0
            for start, h, toks in st.pending:
                skip = max(0, st.next_pos - start)
                if skip < h.shape[0]:
                    hs.append(h[skip:])
                    ids += toks[skip + 1:]
                    own += toks[skip:-1]
                    pos.extend(range(start + skip, start + h.shape[0]))
                    n += h.shape[0] - skip
                    st.next_pos = start + h.shape[0]
            st.clear()
            counts.append(n)
        if not hs:
            return 0
        hidden = torch.cat(hs).to(self.dtype)
        emb = self.lm.model.embed(torch.tensor(ids, device=self.device)).to(self.dtype)
        feats, caches = self.head.step(hidden, emb, torch.tensor(pos, device=self.device),
                                       [st.cache for st in states], counts)
        us = keys = None
        if self.pointer is not None:
            us = CopyPointer.describe(emb, self.lm.model.embed(torch.tensor(own, device=self.device)).to(self.dtype),
                                      hidden, feats)
            keys = self.pointer.key(us)
        end = 0
        for st, cache, n in zip(states, caches, counts):
            st.cache = cache
            if n:
                st.feat = feats[end + n - 1]
                if keys is not None:
                    st.keys = keys[end:end + n] if st.keys is None else torch.cat([st.keys, keys[end:end + n]])
                    st.key_pos += pos[end:end + n]
                    st.last_u = us[end + n - 1]
            end += n
        return sum(counts)

    def _head_probs(self, feats: torch.Tensor) -> torch.Tensor:
        """The head's distribution per row [n, V'] over its draft vocabulary (or the whole one)."""
        if self._rows_mm is None:
            logits = self.lm.compute_logits(feats.to(self.lm.model.act_dtype)).float()
        else:
            logits = self._rows_mm(feats).float()
        return torch.softmax(logits, -1)

    def forget(self, req_ids: Sequence[str]) -> None:
        for rid in req_ids:
            self.states.pop(rid, None)
