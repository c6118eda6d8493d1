"""The EAGLE head's context for positions served from the prefix cache.

The head reads the target's final hidden state at every position it feeds; a prompt position served
from the prefix cache was never computed for this request, so without more the head would draft
without it. `HiddenRows` keeps the target's final hidden state of every computed position beside
the KV cache, at the position's own KV slot (block id * block size + offset, the same block ids):
a block the prefix cache hands to a new request carries those rows along, and the head catches up
on them as on freshly computed ones. A cached block's rows were written when it was computed, for
the same tokens at the same positions (the cache matches whole prefixes), so the head's context is
the one a fresh run gives it.

Each slot also records the token its row belongs to; a run of slots whose tokens do not match the
request's (rows never written: a block filled by an offload tier, a swap-in or another engine's
KV) is not read, and the head goes without those positions as before. Drafts are guesses: a row
never changes the verified output, only how often drafts are right.

Memory: one row [H] in the proposer's dtype per KV slot (SmolLM2-135M, fp32 rows: 2,304 bytes per
token beside the KV cache's 23,040 in bf16)."""
from __future__ import annotations

import numpy as np
import torch

from ridgeline.kernels import cpu_draft
from ridgeline.utils import hugepages


class HiddenRows:
    def __init__(self, num_blocks: int, block_size: int, hidden_size: int, dtype: torch.dtype,
                 device: torch.device):
        self.bs = block_size
        # [slots, H]: a row is read only where its slot records the token it was written for. On the host
        # on huge pages where the kernel grants them, touched now: left to fault in on first write, a
        # step's scattered rows cost it the faults (a batch-64 step's rows: 0.17 ms on 4 KiB pages,
        # 0.29-0.36 on huge pages faulted then, 0.09 touched beforehand)
        slots = num_blocks * block_size
        if device.type == "cpu":
            nbytes = slots * hidden_size * dtype.itemsize
            self.rows = torch.from_numpy(hugepages.zeroed(nbytes)).view(dtype).view(slots, hidden_size)
            self.rows.zero_()
        else:
            self.rows = torch.empty(slots, hidden_size, dtype=dtype, device=device)
        self.tokens = np.full(slots, -1, np.int64)  # the token each slot's row is of (-1: none)
        self.host = device.type == "cpu"
        self._from: torch.Tensor | None = None  # flush()'s: the queued rows' source, their slots and rows
        self._slots: list[int] = []
        self._rows: list[int] = []
        self._tokens: list[int] = []

    @property
    def nbytes(self) -> int:
        return self.rows.numel() * self.rows.element_size()

    def _runs(self, table: list[int], start: int, n: int):
        """(position, first slot, length) of the slot runs of positions start .. start + n - 1."""
        p, end = start, start + n
        while p < end:
            off = p % self.bs
            m = min(end - p, self.bs - off)
            yield p, table[p // self.bs] * self.bs + off, m
            p += m

    def write(self, table: list[int], start: int, hidden: torch.Tensor, row: int, tokens: list[int]) -> None:
        """The rows hidden[row:row + len(tokens)] are positions start.. of the request with this block
        table, their tokens `tokens`. Queued: flush() copies a step's rows of every request at once (a
        copy per request cost ~5 us of Python each, 0.3 ms a step at batch 64; on a GPU a kernel
        launch each). Rows of another tensor flush the queue first."""
        if self._from is not None and self._from is not hidden:
            self.flush()
        self._from = hidden
        if len(tokens) == 1:  # a decode row: the common case, kept short
            self._slots.append(table[start // self.bs] * self.bs + start % self.bs)
            self._rows.append(row)
            self._tokens.append(tokens[0])
            return
        for p, slot, m in self._runs(table, start, len(tokens)):
            i = row + p - start
            self._slots.extend(range(slot, slot + m))
            self._rows.extend(range(i, i + m))
            self._tokens.extend(tokens[p - start:p - start + m])

    def flush(self) -> None:
        """Copy the queued rows (write()) into place and record their tokens."""
        if self._slots:
            dev, hidden = self.rows.device, self._from
            slots = np.array(self._slots, dtype=np.int64)
            if (self.host and hidden.device.type == "cpu" and hidden.dtype == self.rows.dtype and hidden.is_contiguous()
                    and cpu_draft.available()):
                # one C call, no torch op: each costs tens of microseconds right after the target's step
                cpu_draft.copy_rows(self.rows, hidden, slots, np.array(self._rows, dtype=np.int64))
            else:
                src = hidden.index_select(0, torch.tensor(self._rows, device=hidden.device)).to(dev, self.rows.dtype)
                self.rows.index_copy_(0, torch.from_numpy(slots).to(dev), src)
            self.tokens[slots] = self._tokens
        self._from, self._slots, self._rows, self._tokens = None, [], [], []

    def runs(self, table: list[int], n: int, tokens: list[int]) -> list[tuple[int, int, int]] | None:
        """The slot runs (position, first slot, length) holding positions 0 .. n - 1 of a request with
        this block table and these tokens; None unless every slot holds its position's token's row."""
        self.flush()  # rows queued this step count
        out = list(self._runs(table, 0, n))
        for p, slot, m in out:
            if not np.array_equal(self.tokens[slot:slot + m], tokens[p:p + m]):
                return None
        return out
