"""The EAGLE head's decoder layer on the engine's C decoder stack (kernels/decoder_stack.c), with a
paged K/V pool of its own: one C call per head step instead of ~40 small torch ops (which cost
~0.8 ms per batch-1 step against ~0.2 ms of the head's matmuls).

The head rotates q/k in the halves layout (as it was trained); the stack's rotary pairs interleaved
dimensions. The packed q and k rows of the qkv weight are permuted into interleaved order, so q and k
come out permuted alike and every q.k (hence the attention) is unchanged; V is untouched.

A request's cache is a HeadCache: its pool blocks and how many positions it holds (slot index i of
the request holds the i-th position the head was fed; positions may have gaps). A step appends its
rows' K/V at the next slot indices and returns caches advanced past them; the caller keeps or drops
those (a draft chain drops them: its K/V is overwritten when the real positions are fed)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ridgeline.kernels import cpu, cpu_draft, cpu_stack

BLOCK = 16  # positions per pool block


@dataclass
class HeadCache:
    blocks: list[int] = field(default_factory=list)  # shared by a chain's advanced copies
    length: int = 0  # slot indices < length hold fed positions


def interleave_rows(w: torch.Tensor, heads: int, d: int) -> torch.Tensor:
    """w [heads * d, K] with each head's rows in halves order (x_0..x_{d/2-1}, y_0..) -> pairs
    interleaved (x_0, y_0, x_1, y_1, ...)."""
    order = torch.arange(d).view(2, d // 2).T.reshape(-1)  # 0, d/2, 1, d/2 + 1, ...
    return w.view(heads, d, -1)[:, order].reshape(heads * d, -1)


def weight_desc(lin, bias: torch.Tensor | None = None) -> list[int]:
    """A packed linear's C weight descriptor [format, data, scale, bias address] (cpu_stack.WEIGHT_FIELDS)."""
    return [*lin.format.stack_weight(lin), 0 if bias is None else bias.data_ptr()]


def why_not(linears: list, head_dim: int) -> str | None:
    """None if the C stack can run a step of these packed linears (fc, qkv, o, gate_up, down)."""
    if cpu.lib() is None:
        return "no C kernels on this machine"
    cpu_stack.check_layout()
    if not cpu_stack.runs_kv_format(0):
        return "the C stack cannot read fp32 KV caches"
    if head_dim % 2:
        return "odd head_dim"
    for lin in linears:
        if not hasattr(lin, "format"):
            return "the head's matmuls are not the engine's linears"
        desc = lin.format.stack_weight(lin)
        if isinstance(desc, str):
            return desc
        if not cpu_stack.runs_weight_format(desc[0]):
            return f"the C stack has no kernel for weight format {lin.format.name} on this CPU"
    return None


class HeadStack:
    """The head's step (fc, then its layer: attn_norm, qkv, rotary, attention, o, mlp_norm, gate_up,
    SiLU*up, down) in one C call (kernels/eagle_draft.c). head: an EagleHead in fp32; fc, qkv, o,
    gate_up, down: the packed linears (qkv's q/k rows already interleaved, interleave_rows)."""

    def __init__(self, head, fc, qkv, o, gate_up, down):
        c = head.cfg
        self.cfg, self.linears = c, (qkv, o, gate_up, down)  # held: the descriptors point into them
        self.held = [fc, head.fc.bias.detach().float().contiguous()]
        self.fc = torch.tensor(weight_desc(fc, self.held[1]), dtype=torch.int64)
        self.qk = None  # the copy pointer's query and key projections, where the head has a pointer
        if head.pointer is not None:
            self.held += [head.pointer._qk, head.pointer._qk_bias.contiguous()]
            self.qk = torch.tensor(weight_desc(head.pointer._qk, self.held[3]), dtype=torch.int64)
            self.qk_width = self.held[3].shape[0]
        self.norms = (head.attn_norm.weight.detach().float().contiguous(),
                      head.mlp_norm.weight.detach().float().contiguous())
        self.dims = torch.tensor([1, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size,
                                  BLOCK], dtype=torch.int64)
        self.inv_freq = head.inv_freq.double()
        self.cos_sin = torch.empty(0, c.head_dim // 2, 2)
        self.k = self.v = torch.empty(0)
        self.free: list[int] = []
        self._grow(64)
        self.scratch = torch.empty(0)
        # floats of scratch a row needs: the step's own 6H, then the decoder stack's (linear in rows)
        self.row_floats = 6 * c.hidden_size + cpu_stack.scratch_floats(self.dims, 1)
        self.out_x = self.out_qk = torch.empty(0, 1)  # step_ids' outputs, kept between calls

    def _grow(self, blocks: int) -> None:
        """A pool of `blocks` blocks, the old one's contents kept; refreshes the layer descriptor."""
        c, old = self.cfg, self.k.shape[0]
        k = torch.zeros(blocks, BLOCK, c.num_kv_heads, c.head_dim)
        v = torch.zeros_like(k)
        if old:
            k[:old], v[:old] = self.k, self.v
        self.k, self.v = k, v
        self.free += range(blocks - 1, old - 1, -1)
        fields = dict.fromkeys(cpu_stack.LAYER_FIELDS, 0)  # fp32 KV, no window, SiLU, the stack's rotary table
        fields.update(in_norm=self.norms[0].data_ptr(), post_norm=self.norms[1].data_ptr(), k_cache=k.data_ptr(),
                      v_cache=v.data_ptr())
        row = list(fields.values())
        for lin in self.linears:
            row += weight_desc(lin)
        self.layer = torch.tensor([row], dtype=torch.int64)

    def _table(self, positions: int) -> None:
        """cos, sin [P, d/2, 2] fp32 for positions < P (the rotary the head was trained with)."""
        if self.cos_sin.shape[0] >= positions:
            return
        size = max(positions, 2 * self.cos_sin.shape[0], 1024)
        ang = torch.outer(torch.arange(size, dtype=torch.float64), self.inv_freq)
        self.cos_sin = torch.stack([ang.cos(), ang.sin()], -1).float().contiguous()

    def _reserve(self, cache: HeadCache, length: int) -> None:
        need = -(-length // BLOCK) - len(cache.blocks)
        if need > len(self.free):
            self._grow(max(2 * self.k.shape[0], self.k.shape[0] + need))
        for _ in range(max(0, need)):
            cache.blocks.append(self.free.pop())

    def room(self, T: int, outputs: bool = True) -> None:
        """Scratch for steps of up to T rows, and (outputs) the kept output buffers out_x [>= T, H]
        and out_qk [>= T, pointer width]."""
        need = T * self.row_floats
        if self.scratch.numel() < need:
            self.scratch = torch.empty(need)
        if outputs and self.out_x.shape[0] < T:
            self.out_x = torch.empty(max(T, 2 * self.out_x.shape[0]), self.cfg.hidden_size)
            self.out_qk = torch.empty(self.out_x.shape[0], self.qk_width if self.qk is not None else 1)

    def prepare_chain(self, caches: list[HeadCache], positions: list[int], steps: int) -> int:
        """Before a chain of `steps` one-row steps per cache run in C (kernels/eagle_draft.c's chain):
        each cache's slots for them, the rotary table past its last position, scratch and outputs.
        Returns the widest block table (the pool may have grown: read self.layer after this)."""
        for cache in caches:
            self._reserve(cache, cache.length + steps)
        self._table(max(positions) + steps + 1)
        self.room(len(caches))
        return max(len(cache.blocks) for cache in caches)

    def release(self, cache: HeadCache) -> None:
        self.free += cache.blocks
        cache.blocks = []
        cache.length = 0

    def step(self, emb: torch.Tensor, hidden: torch.Tensor, positions: list[int], caches: list[HeadCache],
             counts: list[int], own_emb: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, list[HeadCache], torch.Tensor | None]:
        """emb, hidden [T, H]: the next tokens' embeddings and the hidden states of counts[i] rows of
        request i in turn, at these positions -> (features [T, H], caches advanced past the rows, and
        with own_emb [T, H] (the rows' own tokens' embeddings) the pointer's [queries | keys] [T, 2d])."""
        hidden = hidden.float().contiguous()
        rows = [hidden.data_ptr() + 4 * hidden.shape[1] * t for t in range(hidden.shape[0])]
        return self._run(rows, positions, caches, counts, emb=emb.float().contiguous(),
                         own_emb=None if own_emb is None else own_emb.float().contiguous())

    def step_ids(self, rows: list[int], ids: list[int], own: list[int] | None, table: torch.Tensor, table_fmt: int,
                 positions: list[int], caches: list[HeadCache], counts: list[int], dst: list[int] | None = None
                 ) -> tuple[torch.Tensor, list[HeadCache]]:
        """`step` with the hidden states given by address (rows: fp32 [H] rows the caller keeps alive) and
        the embeddings by token: ids (the next tokens) and own (the rows' own; None: no pointer
        projections) looked up in table [V, H] (the target's embedding, in format table_fmt) in the same
        call. dst: [3, T] addresses (flattened) each row's pointer key [d], query [d] and feature [H]
        are copied to (0: not). Returns (features, caches): the features are rows 0..T-1 of a buffer
        kept between calls, valid until the next call (rows of it may be the next call's `rows`)."""
        return self._run(rows, positions, caches, counts, table=table, table_fmt=table_fmt, ids=ids, own=own,
                         dst=dst)[:2]

    def _run(self, rows: list[int], positions: list[int], caches: list[HeadCache], counts: list[int],
             emb: torch.Tensor | None = None, own_emb: torch.Tensor | None = None, table: torch.Tensor | None = None,
             table_fmt: int = -1, ids: list[int] | None = None, own: list[int] | None = None,
             dst: list[int] | None = None):
        T = len(rows)
        slots, row_seq, key_lens, tables, out_caches = [], [], [], [], []
        for i, (cache, n) in enumerate(zip(caches, counts)):
            self._reserve(cache, cache.length + n)
            for j in range(cache.length, cache.length + n):
                slots.append(cache.blocks[j // BLOCK] * BLOCK + j % BLOCK)
                key_lens.append(j + 1)
            row_seq += [i] * n
            tables.append(cache.blocks)
            out_caches.append(HeadCache(cache.blocks, cache.length + n))
        nb = max(len(t) for t in tables)
        # one int64 array (numpy: a microsecond where each torch op costs tens right after the target's
        # step): positions, slots, row_seq, key_lens, hidden row addresses, ids, own ids [T each], dst
        # [3T], tables [requests, nb], then the group row, whose pointers into the array are filled in
        # once its address is known
        with_pointer = self.qk is not None and (own_emb is not None or own is not None)
        zeros = [0] * T
        meta = np.array(positions + slots + row_seq + key_lens + rows + (ids or zeros)
                        + (own if own is not None and with_pointer else zeros) + (dst or zeros * 3)
                        + [b for t in tables for b in t + [0] * (nb - len(t))] + [0, T, 0, nb, 0, 0, 0], dtype=np.int64)
        at = {"positions": 0, "slots": T, "seq": 2 * T, "lens": 3 * T, "rows": 4 * T, "ids": 5 * T, "own": 6 * T,
              "dst": 7 * T}
        at_group = 10 * T + len(tables) * nb
        base = cpu_draft.addr(meta)
        meta[at_group + 2], meta[at_group + 4], meta[at_group + 5] = base + 8 * 10 * T, base + 8 * at["seq"], \
            base + 8 * at["lens"]
        self._table(max(positions) + 1)
        H = self.cfg.hidden_size
        self.room(T, outputs=table is not None)
        if table is not None:  # the proposer's calls: outputs in buffers kept between calls (no torch op)
            x, qk = self.out_x, self.out_qk if with_pointer else None
        else:
            x = torch.empty(T, H)
            qk = torch.empty(T, self.qk_width) if with_pointer else None
        cpu_draft.eagle_step(self.fc, meta, at, at_group, T, x, self.dims, self.cfg.rms_norm_eps, self.cfg.head_dim ** -0.5,
                             self.layer, self.cos_sin, self.scratch, emb=emb, own_emb=own_emb, table=table,
                             table_fmt=table_fmt, qk_desc=self.qk if with_pointer else None, qk=qk,
                             dst=dst is not None)
        return x, out_caches, qk
