"""The EAGLE proposer's C path, on a CPU with the engine's kernels: a drafting step is C calls fed by
address (kernels/eagle_draft.c): the head's step over the verified rows (catch_up), then the chain,
a draft pick and a head step at a time (draft, chain_step: what a request that samples needs, its
draws made in Python between them), or for greedy requests the whole chain in one call (chain).

Right after the target's step streams its weights through the caches, each torch op costs tens of
microseconds (measured: a one-row copy 50-120 us, against 10 warm), so this path keeps them out of
the per-step work: the head's features and the pointer's queries and keys are written by the C step
straight into per-request buffers (a request's feature [H], its memory's query [d] and key rows),
the hidden rows are read where the runner left them, indices travel in numpy arrays, and outputs
land in buffers kept between steps. The torch path (speculative/eagle.py) computes the same drafts
(tests/test_eagle_stack.py compares them)."""
from __future__ import annotations

import numpy as np
import torch

from ridgeline.kernels import cpu_draft
from ridgeline.kernels.cpu_ops import EMBED_FORMATS

# rows of one catch-up call at most (a request holds at most MAX_PENDING, speculative/eagle.py): bounds the
# head's scratch (about 50 KB a row for the default model's head) when many prompts arrive at once
CHUNK_ROWS = 512


class CDrafting:
    def __init__(self, prop):
        self.prop, self.stack = prop, prop.head.stack
        self.table, self.fmt = prop._table, EMBED_FORMATS[prop._table.dtype]
        self.args = prop._pick
        self.H = prop.head.cfg.hidden_size
        self.d = prop.pointer.dim if prop.pointer is not None else 0
        self.feats = self.logits = self.work = torch.empty(0)
        self.tokens, self.probs = torch.empty(0, dtype=torch.int64), torch.empty(0)
        self.chain_q = torch.empty(0)  # a chain's queries [n, d]

    def _room(self, n: int, m: int) -> None:
        """Output and scratch buffers for n rows, pointer contexts of up to m keys."""
        if self.tokens.shape[0] < n:
            n = max(n, 2 * self.tokens.shape[0], 8)
            self.feats, self.logits = torch.empty(n, self.H), torch.empty(n, self.args["V"])
            self.tokens, self.probs = torch.empty(n, dtype=torch.int64), torch.empty(n)
            self.tokens_np, self.probs_np = self.tokens.numpy(), self.probs.numpy()
            self.chain_q = torch.empty(n, max(self.d, 1))
        if self.work.numel() < m + self.d + 1:
            self.work = torch.empty(2 * (m + self.d + 1))

    def catch_up(self, states: list) -> tuple[int, list[int]]:
        """Feed every pending row of these requests through the head, in one call per CHUNK_ROWS rows;
        each request's last row's feature (and the pointer's query), and every row's pointer key,
        land in its buffers. Returns (rows fed, positions fed) like the torch path."""
        fed, pos, group, rows = 0, [], [], 0
        for st in states + [None]:
            if st is None or (group and rows + st.num_pending > CHUNK_ROWS):
                n, p = self._catch_up(group)
                fed, pos, group, rows = fed + n, pos + p, [], 0
            if st is not None:
                group.append(st)
                rows += st.num_pending
        return fed, pos

    def _catch_up(self, states: list) -> tuple[int, list[int]]:
        rows, ids, own, pos, counts, dst_k, dst_q, dst_f = [], [], [], [], [], [], [], []
        kb = 4 * self.d
        for st in states:
            ranges, i, o, p = st.unread()
            for h, a, b in ranges:  # read in place: the entries stay until after the call
                base, stride = h.data_ptr(), h.stride(0) * h.element_size()
                rows += [base + stride * r for r in range(a, b)]
            ids += i
            own += o
            pos += p
            n = len(p)
            counts.append(n)
            if not n:
                continue
            mem = st.memory
            if mem is not None:
                mem.reserve(mem.n + n)
                at = mem.keys.data_ptr() + kb * mem.n
                dst_k += [at + kb * r for r in range(n)]
                dst_q += [0] * (n - 1) + [mem.query.data_ptr()]
            else:
                dst_k += [0] * n
                dst_q += [0] * n
            dst_f += [0] * (n - 1) + [st.feat.data_ptr()]
        if not rows:
            for st in states:
                st.clear()
            return 0, []
        _, caches = self.stack.step_ids(rows, ids, own if self.d else None, self.table, self.fmt, pos,
                                        [st.cache for st in states], counts, dst_k + dst_q + dst_f)
        end = 0
        for st, cache, n in zip(states, caches, counts):
            st.clear()  # after the call: the pending rows are read in place
            st.cache = cache
            if n:
                st.has_feat = True
                if st.memory is not None:
                    st.memory.fed(pos[end:end + n])
            end += n
        return len(rows), pos

    def start(self, states: list) -> tuple[list[int], list[int] | None]:
        """The drafting rows: each request's feature and (with a pointer) query, by address."""
        return ([st.feat.data_ptr() for st in states],
                None if not self.d else [st.memory.query.data_ptr() for st in states])

    def draft(self, feats: list[int], queries: list[int] | None, mems: list | None,
              step: int) -> tuple[list[int], list[float]]:
        n = len(feats)
        m = [0] * n if mems is None else [mem.known + step for mem in mems]
        self._room(n, max(m))
        a = self.args
        match = mems is not None and a["match"]
        ptrs = np.array([[0] * n if mems is None else [mem.keys.data_ptr() for mem in mems],
                         [0] * n if mems is None else [mem.payload.data_ptr() for mem in mems], m, feats,
                         queries or [0] * n,
                         [cpu_draft.addr(mem.ctx) for mem in mems] if match else [0] * n,
                         [cpu_draft.addr(mem.pos_np) for mem in mems] if match else [0] * n,
                         [mem.ntok - 1 + step for mem in mems] if match else [0] * n], dtype=np.int64)
        cpu_draft.draft_pick(a["rows"], ptrs[3], self.feats, self.logits, self.prop.vocab_ids, self.prop.vocab_index,
                             None if queries is None else ptrs[4], ptrs[0], ptrs[1], ptrs[2], a["scale"], a["gate"],
                             a["gate_b"], self.prop._scratch, self.work, self.tokens, self.probs,
                             match=ptrs[5:8] if match else None, match_bias=a["match_bias"])
        return self.tokens_np[:n].tolist(), self.probs_np[:n].tolist()

    def head_logits(self, rows: list[int]) -> np.ndarray:
        """The last draft()'s logits [len(rows), V'] fp32 of these rows (the pick leaves them here)."""
        return self.logits.numpy()[rows]

    def chain_step(self, feats: list[int], drafted: list[int], own: list[int], positions: list[int], caches: list,
                   mems: list | None, step: int) -> tuple[list[int], list, list[int] | None]:
        """One head step of every chain (row n reads feats[n] as its hidden state, drafted[n] as its
        next token); the new positions' pointer keys go to their memories' scratch rows, their queries
        to this path's chain buffer. Returns (features, caches, queries) by address."""
        n, kb = len(drafted), 4 * self.d
        self._room(n, 0)
        if mems is not None:
            dst = ([mem.keys.data_ptr() + kb * (mem.n + step) for mem in mems]
                   + [self.chain_q.data_ptr() + kb * r for r in range(n)] + [0] * n)
        else:
            dst = [0] * (3 * n)
        x, caches = self.stack.step_ids(feats, drafted, own if self.d else None, self.table, self.fmt, positions, caches,
                                        [1] * n, dst)
        rows = [x.data_ptr() + 4 * self.H * r for r in range(n)]
        return rows, caches, None if mems is None else [self.chain_q.data_ptr() + kb * r for r in range(n)]

    def chain(self, feats: list[int], queries: list[int] | None, mems: list | None, own: list[int],
              positions: list[int], caches: list, ks: list[int], k_max: int, min_first: float,
              min_path: float) -> list[list[int]]:
        """Greedy requests' whole chains in one C call (kernels/eagle_draft.c's ridgeline_eagle_chain):
        the draft() and chain_step() calls EagleProposer.propose makes in turn, with its bars, on the
        same data, so the same drafts. feats, queries: start()'s; own: each row's last token; ks: each
        row's k. Returns each row's drafts."""
        n, stack, a = len(feats), self.stack, self.args
        pointer = mems is not None
        known = [mem.known for mem in mems] if pointer else [0] * n
        self._room(n, max(known) + k_max)
        nb = stack.prepare_chain(caches, positions, k_max - 1)
        match = a["match"] if pointer and a["match"] else 0
        zeros = [0] * n
        rows = np.array(
            feats + (queries if pointer else zeros)
            + ([mem.keys.data_ptr() for mem in mems] + [mem.payload.data_ptr() for mem in mems] if pointer else zeros * 2)
            + known
            + ([cpu_draft.addr(mem.ctx) for mem in mems] + [cpu_draft.addr(mem.pos_np) for mem in mems]
               + [mem.ntok - 1 for mem in mems] if match else zeros * 3)
            + own + positions + ks + ([mem.n for mem in mems] if pointer else zeros) + [c.length for c in caches]
            + [b for c in caches for b in c.blocks + [0] * (nb - len(c.blocks))], dtype=np.int64)
        ids, index, bias = self.prop.vocab_ids, self.prop.vocab_index, a["match_bias"]
        args = np.array([
            a["rows"].data_ptr(), self.feats.data_ptr(), self.logits.data_ptr(), self.H, self.logits.shape[1],
            0 if ids is None else ids.data_ptr(), 0 if index is None else index.data_ptr(), self.d if pointer else 0,
            0 if a["gate"] is None else a["gate"].data_ptr(), self.prop._scratch.data_ptr(), self.work.data_ptr(),
            match, 0 if not match else bias.data_ptr(), stack.fc.data_ptr(), self.table.data_ptr(), self.fmt,
            self.table.shape[0], stack.dims.data_ptr(), stack.layer.data_ptr(), stack.cos_sin.data_ptr(),
            0 if stack.qk is None or not pointer else stack.qk.data_ptr(), stack.out_qk.data_ptr(),
            stack.out_qk.shape[1], stack.out_x.data_ptr(), stack.scratch.data_ptr(), self.chain_q.data_ptr(),
            n, k_max, nb], dtype=np.int64)
        floats = np.array([a["scale"], a["gate_b"], stack.cfg.rms_norm_eps, stack.cfg.head_dim ** -0.5, min_first,
                           min_path], dtype=np.float64)
        tokens, counts = np.empty((n, k_max), dtype=np.int64), np.empty(n, dtype=np.int64)
        cpu_draft.eagle_chain(args, floats, rows, tokens, counts)
        return [tokens[i, :c].tolist() for i, c in enumerate(counts.tolist())]
