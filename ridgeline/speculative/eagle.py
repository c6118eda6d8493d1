"""The `eagle` proposer: a trained head (speculative/eagle_head.py, `ridgeline train-draft`) drafts a chain of
k tokens from the target's hidden states: its argmax for greedy requests (a deterministic guess the
verification keeps while it equals the target's choice), a draw from its own distribution q for
requests that sample (speculative/sampled_drafts.py: verified against q by rejection sampling), so the
output is exact either way.

The runner hands over the hidden state of every row it computed (`wants_hidden`). After each step,
`observe` keeps those of verified positions only (a prefill chunk's rows; a verification step's
rows up to the last accepted proposal), each with the token that follows it (for the last one, the
token the step sampled). Before the next draft, the head feeds a request's pending pairs through its
layer, appending to that request's K/V cache, and drafts from the feature of the last one: possible
when that pair is (hidden at n - 2, token n - 1), n the request's length. Positions a new request
gets from the prefix cache are read from the target's hidden rows kept beside its KV blocks
(speculative/eagle_context.py; absent there, they are absent from the head's cache); a preempted request
recomputes positions the head already holds, which it skips (the tokens there never change). At
most MAX_PENDING rows wait per request (older ones are dropped: a gap), so a request that drafts
nothing for long costs bounded memory and a bounded catch-up."""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from ridgeline.kernels import cpu_draft, cpu_stack
from ridgeline.kernels.cpu_ops import EMBED_FORMATS
from ridgeline.layers.linear import matmul_fn
from ridgeline.formats.options import INT4_GROUP_SIZES, format_name
from ridgeline.engine.proposal import DraftTarget
from ridgeline.speculative.eagle_context import HiddenRows
from ridgeline.speculative.eagle_fast import CDrafting
from ridgeline.speculative.eagle_io import head_rows, load_head
from ridgeline.speculative.eagle_memory import PointerMemory
from ridgeline.speculative.eagle_pointer import CopyPointer, draft_vocab_index, match_lengths, pick
from ridgeline.speculative.sampled_drafts import draft_distribution, draw, samples, seed_generator
from ridgeline.speculative.eagle_stack import weight_desc
from ridgeline.engine.proposal import ProposalRequest, Proposer, register_proposer
from ridgeline.runner.draft import Draft
from ridgeline.utils.device import pick_dtype

MAX_PENDING = 256
WHOLE_ROWS = 64  # steps of at most this many rows keep their hidden states whole (observe)
# How far a chain goes, by the head's confidence (its softmax over the draft vocabulary; EAGLE-2 sizes
# its draft trees by the same products). A first draft costs one verification row more: it is
# proposed when its probability reaches MIN_CONFIDENCE (on the bench's chat workload, first drafts
# below 0.1 matched the target 6% of the time, 15% of positions; 0.1-0.2: 18%; above 0.8: 93%). Each
# later one also costs a step of the head: proposed while the product of the chain's probabilities
# reaches MIN_PATH_CONFIDENCE (two-draft chains with a product below 0.1 were right in both drafts
# 7% of the time, 62% of them; 0.1-0.2: 14%; 0.2-0.3: 34%).
MIN_CONFIDENCE = 0.1
MIN_PATH_CONFIDENCE = 0.2


def head_format(kernels: frozenset, cfg) -> str | None:
    """The weight format the head's layer and LM-head rows are packed in on a CPU, among the quantized
    formats whose C kernels run here (`kernels`): a draft step reads them from memory (the target's
    step has just streamed its own weights through the caches), so fewer bytes are a shorter draft.
    Group-wise int4 (Q4_1's grid) in the largest group that divides every input width, else int8
    (per channel), else None: the target's own dtype. Measured on the default model's head (Zen 5,
    batch-1 chat, k = 2): int4-g64 drafted in 0.37 ms a step where int8 took 0.50 and bf16 more, with
    the same accepted tokens a step (1.693 both, over the chat workload's first 8 prompts); drafts
    are guesses, so their precision never changes the verified output."""
    widths = [cfg.hidden_size, 2 * cfg.hidden_size, cfg.intermediate_size]
    if cfg.pointer_dim:
        widths.append(4 * cfg.hidden_size)  # the copy pointer's query/key projection reads 4 rows of H
    groups = [g for g in INT4_GROUP_SIZES if all(w % g == 0 for w in widths)]
    if "int4" in kernels and groups:
        return format_name("int4", max(groups), False)
    return "int8" if "int8" in kernels else None


@dataclass
class _State:
    cache: object  # the head's K/V of positions fed so far (EagleHead.empty_cache)
    next_pos: int = 0  # positions < next_pos are fed (or skipped)
    feat: torch.Tensor | None = None  # [H] the head's feature at next_pos - 1 (the C path: a kept buffer)
    has_feat: bool = False
    # (pos, hidden, row, the n + 1 tokens at positions pos .. pos + n: each row's own and next), the n
    # rows being hidden[row:row + n] (a step's whole hidden states, kept rather than copied)
    pending: list[tuple[int, torch.Tensor, int, list[int]]] = field(default_factory=list)
    num_pending: int = 0  # rows in pending
    memory: PointerMemory | None = None  # the copy pointer's context (heads that have one)
    gen: torch.Generator | None = None  # a seeded sampling request's draft draws (speculative/sampled_drafts.py)

    def add(self, start: int, hidden: torch.Tensor, toks: list[int], row: int = 0) -> None:
        """Queue rows hidden[row:row + len(toks) - 1], keeping the newest MAX_PENDING (a cut through
        the oldest entry keeps its tail)."""
        self.pending.append((start, hidden, row, toks))
        self.num_pending += len(toks) - 1
        while self.num_pending > MAX_PENDING:
            start, h, r, ids = self.pending[0]
            cut = min(len(ids) - 1, self.num_pending - MAX_PENDING)
            self.pending[0] = (start + cut, h, r + cut, ids[cut:])
            if cut == len(ids) - 1:
                self.pending.pop(0)
            self.num_pending -= cut

    def clear(self) -> None:
        self.pending.clear()
        self.num_pending = 0

    def unread(self) -> tuple[list[tuple[torch.Tensor, int, int]], list[int], list[int], list[int]]:
        """The pending rows the head has not read (a preempted request's recomputed ones skipped), and
        marks them read: (hidden row ranges (tensor, first, end), each row's next token, its own token,
        its position). The entries stay until clear()."""
        ranges, ids, own, pos = [], [], [], []
        for start, h, row, toks in self.pending:
            skip = max(0, self.next_pos - start)
            k = len(toks) - 1
            if skip < k:
                ranges.append((h, row + skip, row + k))
                ids += toks[skip + 1:]
                own += toks[skip:-1]
                pos.extend(range(start + skip, start + k))
                self.next_pos = start + k
        return ranges, ids, own, pos


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
        # the same two on the host, for sampled drafts (speculative/sampled_drafts.py)
        self._vocab_np = (None, None) if self.vocab_ids is None else (self.vocab_ids.cpu().numpy(),
                                                                       self.vocab_index.cpu().numpy())
        rows = head_rows(self.lm, self.vocab_ids)
        # On a CPU the head's matmuls (and its LM-head rows) run in the engine's own packed kernels,
        # in the target's weight dtype: torch's small matmuls right after the
        # decoder stack's step ran 4-6x slower than alone (its thread pool and the stack's contend
        # for the two cores, and the head's weights come back from memory). Elsewhere the head
        # drafts in torch, in the target's activation dtype where that is bf16 and bf16 is native.
        # Drafts are guesses: their precision never changes the verified output.
        plan = self.lm.model.plan
        if target.device.type == "cpu" and target.dtype in plan.packed:
            fmt = self.weight_format = head_format(plan.quant, head.cfg)
            if fmt:
                import ridgeline.layers.int_formats  # noqa: F401  (registers the int8 weight format)

            def pack(w):  # the head's weight multiplied as the target's dense (or int8) layers are
                return matmul_fn(w.to(target.dtype).contiguous(), plan, fmt)
            self.dtype = torch.float32
            self.head = head.to(target.device)
            self.head.use_kernels(pack)
            self._rows_mm = None if rows is None else pack(rows)
        else:
            self.weight_format = None
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
        # every step's drafting in C where the head's step, its embedding lookups and its pick all run there
        self._c = CDrafting(self) if self._table is not None and self._pick is not None else None
        self.fused_chain = True  # on the C path, greedy chains in one call (False: a call per pick and step)
        self.states: dict[str, _State] = {}
        # the target's hidden rows beside its KV blocks, for positions a request gets from the prefix cache
        self.context = (HiddenRows(target.num_blocks, target.block_size, self.lm.cfg.hidden_size, self.dtype,
                                   target.device) if target.kv is not None and target.kv.caching else None)

    def _new_state(self) -> _State:
        st = _State(self.head.empty_cache())
        if self._c is not None:  # the C step writes each request's last feature here
            st.feat = torch.zeros(self.head.cfg.hidden_size)
        if self.pointer is not None:
            st.memory = PointerMemory(self.pointer.dim, self.device, self.dtype)
        return st

    def observe(self, plan, sampled, hidden: torch.Tensor, requests: dict) -> None:
        """After a step: keep the hidden states of its verified positions, each with its next token."""
        kept = {s.req_id: s for s in sampled}
        # a step's hidden states (the runner's fresh tensor) are kept whole until the head reads them,
        # each request's pending entry naming its rows: no op per request (each torch op right after
        # the target's step costs tens of microseconds). A large step's (prefill chunks) are copied per
        # request instead, so no request holds the others' rows for long: at most MAX_PENDING entries
        # of WHOLE_ROWS rows each per request
        whole = None
        if hidden.shape[0] <= WHOLE_ROWS:
            whole = hidden if hidden.dtype == self.dtype else hidden.to(self.dtype)
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
                st = self.states[seq.req_id] = self._new_state()
                if start and self.context is not None and seq.cache_start is None:
                    self._from_prefix_cache(st, seq, requests[seq.req_id].token_ids)
            if self.context is not None and seq.cache_start is None:  # (KV eviction: slots are not positions)
                self.context.write(seq.block_table, start, hidden, row, toks[:valid])
            if start + valid > st.next_pos and whole is not None:
                st.add(start, whole, toks, row)
            elif start + valid > st.next_pos:
                st.add(start, hidden[row:row + valid].to(self.dtype, copy=True), toks)
            row += n
        if self.context is not None:
            self.context.flush()

    def _from_prefix_cache(self, st: _State, seq, tokens: list[int]) -> None:
        """A new request whose first seq.start positions came from the prefix cache: queue their hidden
        rows from the blocks that hold them, read in place like a step's (each row with its next token)."""
        runs = self.context.runs(seq.block_table, seq.start, tokens)
        for p, slot, m in runs or ():
            st.add(p, self.context.rows, tokens[p:p + m + 1], slot)

    @torch.inference_mode()
    def propose(self, requests: Sequence[ProposalRequest]) -> list[list[int] | Draft]:
        impl = self._c or self  # the C path (speculative/eagle_fast.py) or torch's (below): the same methods
        states = [self.states.get(r.req_id) for r in requests]
        t0 = time.perf_counter()
        rows, _ = impl.catch_up([st for st in states if st is not None and st.pending])
        # rows past a verification's worth per request (k + 1) are a prompt or a gap caught up once
        steady = sum(r.k + 1 for r in requests)
        self.setup_rows = max(0, rows - steady)
        self.setup_time = (time.perf_counter() - t0) * self.setup_rows / rows if rows else 0.0
        out: list[list[int]] = [[] for _ in requests]
        live = [i for i, (r, st) in enumerate(zip(requests, states))
                if st is not None and st.has_feat and st.next_pos == len(r.token_ids) - 1]
        if not live:
            return out
        caches = [states[i].cache for i in live]
        positions = [len(requests[i].token_ids) - 1 for i in live]
        k_max = max(requests[i].k for i in live)
        mems = None if self.pointer is None else [states[i].memory for i in live]
        match = self.pointer is not None and self.pointer.match
        if mems is not None:
            for i, mem in zip(live, mems):
                mem.fill(requests[i].token_ids)
                mem.reserve(mem.n + k_max)  # the chain's scratch rows
                if match:
                    mem.tokens(requests[i].token_ids, k_max)
        feats, queries = impl.start([states[i] for i in live])
        own = [requests[i].token_ids[-1] for i in live]  # each chain position's own token
        sampling = [n for n, i in enumerate(live) if samples(requests[i].params)]  # drafts drawn from q
        if impl is self._c and not sampling and self.fused_chain:  # the loop below in one C call
            drafts = impl.chain(feats, queries, mems, own, positions, caches, [requests[i].k for i in live], k_max,
                                MIN_CONFIDENCE, MIN_PATH_CONFIDENCE)
            for i, d in zip(live, drafts):
                out[i] = d
            return out
        stopped, path = [False] * len(live), [1.0] * len(live)
        q_rows: dict[int, list[tuple]] = {n: [] for n in sampling}
        for step in range(k_max):
            drafted, probs = impl.draft(feats, queries, mems, step)
            # draws only for chains still going: a request's generator never pays for another's longer chain
            going = [n for n in sampling if not stopped[n]]
            q = self._draw(impl, going, [requests[live[n]] for n in going], [states[live[n]] for n in going],
                           drafted, probs)
            for n, (i, t, p) in enumerate(zip(live, drafted, probs)):
                path[n] *= p
                bar = MIN_CONFIDENCE if step == 0 else MIN_PATH_CONFIDENCE
                stopped[n] = stopped[n] or path[n] < bar or step >= requests[i].k
                if not stopped[n]:
                    out[i].append(t)
                    if n in q_rows:
                        q_rows[n].append(q[n])
                # no step of the head for a chain whose next draft could not pass the bar
                stopped[n] = stopped[n] or path[n] < MIN_PATH_CONFIDENCE or step + 1 >= requests[i].k
            if step + 1 == k_max or all(stopped):
                break
            feats, caches, queries = impl.chain_step(feats, drafted, own, [p + step for p in positions], caches, mems,
                                                     step)
            if mems is not None:  # the new position's token is the previous key's payload
                for n, mem in enumerate(mems):
                    mem.set_payload(mem.known + step, [drafted[n]])
                    if match:  # the key just written is the chain's position p + step; its token drafted[n]
                        mem.chain(mem.n + step, positions[n] + step, positions[n] + 1 + step, drafted[n])
            own = drafted
        for n, rows in q_rows.items():
            if rows:
                ids_np = self._vocab_np[0]
                ids = None if ids_np is None else torch.from_numpy(
                    np.stack([np.append(ids_np, star) for _, star in rows])).to(self.device)
                out[live[n]] = Draft(out[live[n]], torch.from_numpy(np.stack([q for q, _ in rows])).to(self.device), ids)
        return out

    def backlog(self, req_id: str, num_tokens: int) -> int:
        """The rows queued for the head (verified positions it has not read yet)."""
        st = self.states.get(req_id)
        return 0 if st is None else st.num_pending

    def _draw(self, impl, rows: list[int], requests: list[ProposalRequest], states: list[_State],
              drafted: list[int], probs: list[float]) -> dict[int, tuple[np.ndarray, int]]:
        """For the sampling requests' chain rows: replace the head's pick with a draw from q, in place,
        and return each row's q as (probs over the draft vocabulary then x*, x*) (the whole
        vocabulary's: x* added in place). q mixes the pick x* (a copy pointer's, or the head's top)
        into the head's distribution h (speculative/sampled_drafts.py): q = b * [x*] + (1 - b) * h, b such
        that q(x*) is the pick's own probability where that exceeds h(x*) (b = 0 elsewhere). The
        chain's length rule reads q's top probability in place of the pick's: never the draw."""
        if not rows:
            return {}
        logits = impl.head_logits(rows)
        ids_np, index_np = self._vocab_np
        out = {}
        for j, (n, r, st) in enumerate(zip(rows, requests, states)):
            if st.gen is None and r.seed is not None:
                st.gen = seed_generator(r.seed)
            h = draft_distribution(logits[j], r.params)
            star, p_star = drafted[n], min(probs[n], 1.0)
            at = star if index_np is None else int(index_np[star])
            h_star = float(h[at]) if at >= 0 else 0.0
            b = max(0.0, (p_star - h_star) / (1.0 - h_star)) if h_star < 1.0 else 0.0
            u = torch.rand(2, generator=st.gen).tolist()
            if u[0] < b:
                x = star
            else:
                x = draw(h, u[1])
                x = x if ids_np is None else int(ids_np[x])
            drafted[n] = x
            q = h * (1.0 - b)
            probs[n] = max(p_star if b > 0 else 0.0, float(q.max()))
            if self.vocab_ids is None:
                q[star] += b
            else:  # x* as one more column (it may be outside the draft vocabulary; q_at adds duplicates)
                q = np.append(q, b)
            out[n] = (q.astype(np.float32), star)
        return out

    # The torch path (any device; the C path in speculative/eagle_fast.py mirrors these four methods).

    def start(self, states: list[_State]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The drafting rows: features [n, H] and (with a pointer) queries [n, d]."""
        return (torch.stack([st.feat for st in states]),
                None if self.pointer is None else torch.stack([st.memory.query for st in states]))

    def chain_step(self, feats: torch.Tensor, tokens: list[int], own: list[int], positions: list[int], caches: list,
                   mems: list[PointerMemory] | None, step: int):
        """One head step of every chain: row n reads feats[n] as its hidden state and tokens[n] (just
        drafted) as its next token -> (features, caches, queries or None); the new positions' pointer
        keys go to their memories' scratch rows."""
        ones = [1] * len(tokens)
        emb = self.lm.model.embed(torch.tensor(tokens, device=self.device)).to(self.dtype)
        pos = torch.tensor(positions, device=self.device)
        if self.pointer is None:
            return *self.head.step(feats, emb, pos, caches, ones), None
        own_emb = self.lm.model.embed(torch.tensor(own, device=self.device)).to(self.dtype)
        feats, caches, queries, keys = self.head.step_pointer(feats, emb, own_emb, pos, caches, ones)
        for n, mem in enumerate(mems):
            mem.keys[mem.n + step] = keys[n]
        return feats, caches, queries

    def _c_pick_args(self) -> dict | None:
        """What the C draft pick needs (kernels/eagle_draft.c), or None where it cannot run: not on the
        engine's CPU kernels, or a head over the whole vocabulary (its logits are the target's)."""
        lin = self._rows_mm
        if not hasattr(lin, "format") or not cpu_draft.available():
            return None
        desc = lin.format.stack_weight(lin)
        if isinstance(desc, str) or not cpu_stack.runs_weight_format(desc[0]):
            return None
        args = {"rows": torch.tensor(weight_desc(lin), dtype=torch.int64), "V": len(self.vocab_ids), "gate": None,
                "gate_b": 0.0, "scale": 0.0, "match": 0, "match_bias": None}
        if self.pointer is not None:
            args.update(gate=self.pointer.gate.weight.detach()[0].float().contiguous(),
                        gate_b=float(self.pointer.gate.bias.detach()), scale=float(self.pointer.scale.detach()))
            if self.pointer.match:
                args.update(match=self.pointer.match,
                            match_bias=self.pointer.match_bias.detach().float().contiguous())
        return args

    def draft(self, feats: torch.Tensor, queries: torch.Tensor | None, mems: list[PointerMemory] | None,
              step: int) -> tuple[list[int], list[float]]:
        """-> (each row's draft token, its probability): the head's most likely token, or with a copy
        pointer the mixture's (eagle_pointer.pick), the pointer reading a row's first known + step keys."""
        probs = self._head_probs(feats)
        probs_top, itop = probs.max(-1)
        tokens = itop if self.vocab_ids is None else self.vocab_ids[itop]
        tokens, ptop = tokens.tolist(), probs_top.tolist()
        for r, mem in enumerate(mems or []):
            m = mem.known + step
            if m:
                lengths = None
                if self.pointer.match:  # the pointer's exact-match lengths, on the host (speculative/eagle_pointer.py)
                    lengths = torch.from_numpy(match_lengths(mem.ctx, mem.pos_np[:m] + 1, mem.ntok - 1 + step,
                                                             self.pointer.match)).to(self.device)[None]
                a, g = self.pointer.attend(queries[r:r + 1], mem.keys[:m], None, feats[r:r + 1], probs_top[r:r + 1],
                                           lengths)
                tokens[r], ptop[r] = pick(a[0], float(g[0]), mem.payload[:m], probs[r], self.vocab_index,
                                          (tokens[r], ptop[r]), self._scratch)
        return tokens, ptop

    def catch_up(self, states: list[_State]) -> tuple[int, list[int]]:
        """Feed every pending (hidden, next token) pair of these requests through the head, in one
        call; returns (how many rows that was, their positions)."""
        hs, ids, own, pos, counts = [], [], [], [], []
        for st in states:
            ranges, i, o, p = st.unread()
            hs += [h[a:b] for h, a, b in ranges]
            ids += i
            own += o
            pos += p
            st.clear()
            counts.append(len(p))
        if not hs:
            return 0, []
        caches = [st.cache for st in states]
        hidden = torch.cat(hs).to(self.dtype)
        T = hidden.shape[0]
        # each row's next token, and (for the pointer) its own, embedded in one call
        emb = self.lm.model.embed(torch.tensor(ids + (own if self.pointer is not None else []),
                                               device=self.device)).to(self.dtype)
        positions = torch.tensor(pos, device=self.device)
        queries = keys = None
        if self.pointer is None:
            feats, caches = self.head.step(hidden, emb, positions, caches, counts)
        else:
            feats, caches, queries, keys = self.head.step_pointer(hidden, emb[:T], emb[T:], positions, caches, counts)
        end = 0
        for st, cache, n in zip(states, caches, counts):
            st.cache = cache
            if n:
                st.feat, st.has_feat = feats[end + n - 1], True
                if keys is not None:
                    st.memory.add(keys[end:end + n], pos[end:end + n], queries[end + n - 1])
            end += n
        return T, pos

    def _head_logits(self, feats: torch.Tensor) -> torch.Tensor:
        """The head's logits per row [n, V'] fp32 over its draft vocabulary (or the whole one)."""
        if self._rows_mm is None:
            return self.lm.compute_logits(feats.to(self.lm.model.act_dtype)).float()
        return self._rows_mm(feats).float()

    def _head_probs(self, feats: torch.Tensor) -> torch.Tensor:
        self._feats = feats
        return torch.softmax(self._head_logits(feats), -1)

    def head_logits(self, rows: list[int]) -> np.ndarray:
        """The last draft()'s logits [len(rows), V'] fp32 of these rows, on the host."""
        return self._head_logits(self._feats[rows]).cpu().numpy()

    def summary(self) -> str:
        vocab = "the whole vocabulary" if self.vocab_ids is None else f"{len(self.vocab_ids)} draft tokens"
        ptr = (", no copy pointer" if self.pointer is None else f", a copy pointer (width {self.pointer.dim}"
               + (f", exact matches up to {self.pointer.match} tokens)" if self.pointer.match else ")"))
        fmt = self.weight_format or "the target's dtype"
        how = (f"drafting in C (weights in {fmt}; its step on the decoder stack with a paged K/V of its own, then "
               "the pick)"
               if self._c is not None else "drafting in torch (slower: the C kernels do not run this head here)")
        ctx = ("" if self.context is None else
               f"; prefix-cached positions read from the target's hidden rows kept beside its KV blocks "
               f"({self.context.nbytes / 2**20:.0f} MiB)")
        return f"head over {vocab}{ptr}; {how}{ctx}"

    def forget(self, req_ids: Sequence[str]) -> None:
        for rid in req_ids:
            st = self.states.pop(rid, None)
            if st is not None:
                self.head.release(st.cache)
