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

import numpy as np
import torch

from ridgeline.layers.linear import matmul_fn
from ridgeline.spec.draft_load import DraftTarget
from ridgeline.spec.eagle_io import head_rows, load_head
from ridgeline.kernels import cpu_draft, cpu_stack
from ridgeline.kernels.cpu_ops import EMBED_FORMATS
from ridgeline.spec.eagle_memory import PointerMemory
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
    cache: object  # the head's K/V of positions fed so far (EagleHead.empty_cache)
    next_pos: int = 0  # positions < next_pos are fed (or skipped)
    feat: torch.Tensor | None = None  # [H] the head's feature at next_pos - 1
    # (pos, hidden [n, H], the n + 1 tokens at positions pos .. pos + n: each row's own and next)
    pending: list[tuple[int, torch.Tensor, list[int]]] = field(default_factory=list)
    num_pending: int = 0  # rows in pending
    memory: PointerMemory | None = None  # the copy pointer's context (heads that have one)

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
        self._pick = self._c_pick_args()  # None: drafts picked in torch
        # the embedding table the head's C step looks tokens up in (None: the catch-up embeds in torch)
        table = self.lm.model.embed_tokens.weight
        self._table = (table.detach() if self.head.stack is not None and self.lm.model.tp is None and
                       table.device.type == "cpu" and table.dtype in EMBED_FORMATS and table.is_contiguous() else None)
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
                if self.pointer is not None:
                    st.memory = PointerMemory(self.pointer.dim, self.device, self.dtype)
            if start + valid > st.next_pos:  # a copy in the head's dtype (contiguous rows: the C step reads them by address)
                st.add(start, hidden[row:row + valid].to(self.dtype, copy=True), toks)
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
        positions = [len(requests[i].token_ids) - 1 for i in live]
        k_max = max(requests[i].k for i in live)
        mems = None if self.pointer is None else [states[i].memory for i in live]
        queries = None
        if mems is not None:
            for i, mem in zip(live, mems):
                mem.fill(requests[i].token_ids)
                mem.reserve(mem.n + k_max)  # the chain's scratch rows
            queries = torch.stack([mem.query for mem in mems])
        stopped, path = [False] * len(live), [1.0] * len(live)
        own = [requests[i].token_ids[-1] for i in live]  # each chain position's own token
        for step in range(k_max):
            tokens, probs = self._draft(feats, queries, mems, step)
            drafted = tokens.tolist()
            for n, (i, t, p) in enumerate(zip(live, drafted, probs.tolist())):
                path[n] *= p
                bar = MIN_CONFIDENCE if step == 0 else MIN_PATH_CONFIDENCE
                stopped[n] = stopped[n] or path[n] < bar or step >= requests[i].k
                if not stopped[n]:
                    out[i].append(t)
                # no step of the head for a chain whose next draft could not pass the bar
                stopped[n] = stopped[n] or path[n] < MIN_PATH_CONFIDENCE or step + 1 >= requests[i].k
            if step + 1 == k_max or all(stopped):
                break
            feats, caches, queries, keys = self._chain_step(feats, drafted, own, [p + step for p in positions], caches)
            if mems is not None:  # the new position's key; its token is the previous key's payload
                for n, mem in enumerate(mems):
                    mem.keys[mem.n + step] = keys[n]
                    mem.payload[mem.known + step] = drafted[n]
            own = drafted
        return out

    def _chain_step(self, feats: torch.Tensor, tokens: list[int], own: list[int], positions: list[int], caches: list):
        """One head step of every chain: row n reads feats[n] as its hidden state and tokens[n] (just
        drafted) as its next token -> (features, caches, and with a pointer the new positions' queries
        and keys, else None, None)."""
        ones = [1] * len(tokens)
        if self._table is not None:
            feats = feats.contiguous()
            rows = [feats.data_ptr() + feats.stride(0) * feats.element_size() * n for n in range(len(tokens))]
            new, caches, qk = self.head.stack.step_ids(rows, tokens, own if self.pointer is not None else None,
                                                       self._table, positions, caches, ones)
            if qk is None:
                return new, caches, None, None
            return new, caches, qk[:, :self.pointer.dim], qk[:, self.pointer.dim:]
        emb = self.lm.model.embed(torch.tensor(tokens, device=self.device)).to(self.dtype)
        pos = torch.tensor(positions, device=self.device)
        if self.pointer is None:
            return *self.head.step(feats, emb, pos, caches, ones), None, None
        own_emb = self.lm.model.embed(torch.tensor(own, device=self.device)).to(self.dtype)
        return self.head.step_pointer(feats, emb, own_emb, pos, caches, ones)

    def _c_pick_args(self) -> dict | None:
        """What the C draft pick needs (kernels/draft_pick.c), or None where it cannot run: not on the
        engine's CPU kernels, or a head over the whole vocabulary (its logits are the target's)."""
        lin = self._rows_mm
        if not hasattr(lin, "format") or not cpu_draft.available():
            return None
        desc = lin.format.stack_weight(lin)
        if isinstance(desc, str) or not cpu_stack.runs_weight_format(desc[0]):
            return None
        args = {"rows": torch.tensor([*desc, 0], dtype=torch.int64), "V": len(self.vocab_ids), "gate": None,
                "gate_b": 0.0, "scale": 0.0}
        if self.pointer is not None:
            args.update(gate=self.pointer.gate.weight.detach()[0].float().contiguous(),
                        gate_b=float(self.pointer.gate.bias.detach()), scale=float(self.pointer.scale.detach()))
        return args

    def _draft(self, feats: torch.Tensor, queries: torch.Tensor | None, mems: list[PointerMemory] | None,
               step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (each row's draft token, its probability): the head's most likely token, or with a copy
        pointer the mixture's (eagle_pointer.pick), the pointer reading a row's first known + step keys."""
        n = feats.shape[0]
        m = [0] * n if mems is None else [mem.known + step for mem in mems]
        if self._pick is not None:
            a = self._pick
            ptrs = np.array([[0] * n if mems is None else [mem.keys.data_ptr() for mem in mems],
                             [0] * n if mems is None else [mem.payload.data_ptr() for mem in mems], m], dtype=np.int64)
            tokens, probs = torch.empty(n, dtype=torch.int64), torch.empty(n)
            d = 0 if queries is None else queries.shape[1]
            cpu_draft.draft_pick(a["rows"], feats.contiguous(), torch.empty(n, a["V"]), self.vocab_ids,
                                 self.vocab_index, None if queries is None else queries.contiguous(), ptrs[0], ptrs[1],
                                 ptrs[2], a["scale"], a["gate"], a["gate_b"], self._scratch,
                                 torch.empty(max(m) + d + 1), tokens, probs)
            return tokens, probs
        probs = self._head_probs(feats)
        probs_top, itop = probs.max(-1)
        tokens = itop if self.vocab_ids is None else self.vocab_ids[itop]
        if mems is None:
            return tokens, probs_top
        tokens, ptop = tokens.tolist(), probs_top.tolist()
        for r, mem in enumerate(mems):
            if m[r]:
                a, g = self.pointer.attend(queries[r:r + 1], mem.keys[:m[r]], None, feats[r:r + 1],
                                           probs_top[r:r + 1])
                tokens[r], ptop[r] = pick(a[0], float(g[0]), mem.payload[:m[r]], probs[r], self.vocab_index,
                                          (tokens[r], ptop[r]), self._scratch)
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
        caches = [st.cache for st in states]
        queries = keys = None
        if self._table is not None:  # one C call: the rows by address, the embeddings looked up there
            rows = [h.data_ptr() + h.stride(0) * h.element_size() * r for h in hs for r in range(h.shape[0])]
            feats, caches, qk = self.head.stack.step_ids(rows, ids, own if self.pointer is not None else None,
                                                         self._table, pos, caches, counts)
            if qk is not None:
                queries, keys = qk[:, :self.pointer.dim], qk[:, self.pointer.dim:]
        else:
            hidden = torch.cat(hs).to(self.dtype)
            T = hidden.shape[0]
            # each row's next token, and (for the pointer) its own, embedded in one call
            emb = self.lm.model.embed(torch.tensor(ids + (own if self.pointer is not None else []),
                                                   device=self.device)).to(self.dtype)
            positions = torch.tensor(pos, device=self.device)
            if self.pointer is None:
                feats, caches = self.head.step(hidden, emb, positions, caches, counts)
            else:
                feats, caches, queries, keys = self.head.step_pointer(hidden, emb[:T], emb[T:], positions, caches,
                                                                      counts)
        end = 0
        for st, cache, n in zip(states, caches, counts):
            st.cache = cache
            if n:
                st.feat = feats[end + n - 1]
                if keys is not None:
                    st.memory.add(keys[end:end + n], pos[end:end + n], queries[end + n - 1])
            end += n
        return sum(counts)

    def _head_probs(self, feats: torch.Tensor) -> torch.Tensor:
        """The head's distribution per row [n, V'] over its draft vocabulary (or the whole one)."""
        if self._rows_mm is None:
            logits = self.lm.compute_logits(feats.to(self.lm.model.act_dtype)).float()
        else:
            logits = self._rows_mm(feats).float()
        return torch.softmax(logits, -1)

    def summary(self) -> str:
        c = self.head_config
        vocab = "the whole vocabulary" if self.vocab_ids is None else f"{len(self.vocab_ids)} draft tokens"
        ptr = f", a copy pointer (width {self.pointer.dim})" if self.pointer is not None else ", no copy pointer"
        layer = "its layer on the C decoder stack" if self.head.stack is not None else "its layer in torch (slower)"
        pick_ = "drafts picked in C" if self._pick is not None else "drafts picked in torch"
        return f"head of {c['head']['intermediate_size']}-wide MLP over {vocab}{ptr}; {layer}, {pick_}"

    def forget(self, req_ids: Sequence[str]) -> None:
        for rid in req_ids:
            st = self.states.pop(rid, None)
            if st is not None:
                self.head.release(st.cache)
