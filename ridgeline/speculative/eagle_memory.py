"""One request's copy-pointer context (speculative/eagle_pointer.py) while the EAGLE proposer drafts for it:
the pointer's key of every position the head was fed, those positions, the token that followed each
(x_{j+2}, filled in as the request's tokens arrive) and the query of the last fed position; for a
pointer that reads exact matches, also the request's tokens and the keys' positions on the host
(numpy), a chain's drafts and positions written past the known ones like its keys.

Buffers grow by doubling (amortised O(1) per position, where concatenation copied the whole context
every step). A draft chain writes its own positions' keys and tokens past `n` and `known`, where the
next real positions overwrite them: only the first `known` keys (and the chain's) are ever read."""
from __future__ import annotations

import numpy as np
import torch


class PointerMemory:
    def __init__(self, dim: int, device: torch.device, dtype: torch.dtype = torch.float32):
        self.keys = torch.empty(0, dim, device=device, dtype=dtype)  # [capacity, dim]; rows < n are fed positions'
        self.payload = torch.empty(0, dtype=torch.long, device=device)  # [capacity]; < known filled
        self._payload_np = self.payload.numpy() if self.payload.device.type == "cpu" else None  # its memory
        self.pos_np = np.zeros(0, dtype=np.int64)  # [capacity]: row i's position (< n fed, increasing; then a chain's)
        self.ctx = np.zeros(0, dtype=np.int64)  # the request's tokens (< ntok), then a chain's drafts
        self.ntok = 0
        self.n = 0
        self.known = 0
        # [dim] the last fed position's query: the C path writes into this buffer, torch's replaces it
        self.query = torch.zeros(dim, device=device, dtype=dtype)

    def reserve(self, size: int) -> None:
        """Room for `size` rows (a chain's scratch included)."""
        cap = self.keys.shape[0]
        if size <= cap:
            return
        cap = max(size, 2 * cap, 64)
        keys = self.keys.new_empty(cap, self.keys.shape[1])
        payload = self.payload.new_zeros(cap)
        keys[:self.n], payload[:self.known] = self.keys[:self.n], self.payload[:self.known]
        self.keys, self.payload = keys, payload
        pos = np.zeros(cap, dtype=np.int64)
        pos[:self.n] = self.pos_np[:self.n]
        self.pos_np = pos
        self._payload_np = payload.numpy() if payload.device.type == "cpu" else None

    def set_payload(self, at: int, tokens: list[int]) -> None:
        """payload[at:at + len(tokens)] = tokens (through numpy on a CPU: no torch op)"""
        if self._payload_np is not None:
            self._payload_np[at:at + len(tokens)] = tokens
        else:
            self.payload[at:at + len(tokens)] = torch.tensor(tokens, dtype=torch.long)

    def add(self, keys: torch.Tensor, positions: list[int], query: torch.Tensor) -> None:
        """Fed rows: their keys [r, dim] and positions (after every earlier one), the last one's query."""
        r = keys.shape[0]
        self.reserve(self.n + r)
        self.keys[self.n:self.n + r] = keys
        self.fed(positions)
        self.query = query

    def fed(self, positions: list[int]) -> None:
        """Rows n.. now hold the keys of these positions (written by the caller, room reserved)."""
        self.pos_np[self.n:self.n + len(positions)] = positions
        self.n += len(positions)

    @property
    def positions(self) -> list[int]:
        """The n fed rows' positions."""
        return self.pos_np[:self.n].tolist()

    def chain(self, row: int, position: int, at: int, token: int) -> None:
        """A chain's scratch: key row `row` is at `position`; ctx[at] = a drafted token (room reserved)."""
        self.pos_np[row] = position
        self.ctx[at] = token

    def tokens(self, token_ids: list[int], extra: int) -> None:
        """ctx[:len(token_ids)] = the request's tokens (copying only those new since the last call),
        with room for `extra` more (a chain's drafts)."""
        need = len(token_ids) + extra
        if self.ctx.shape[0] < need:
            ctx = np.zeros(max(need, 2 * self.ctx.shape[0], 256), dtype=np.int64)
            ctx[:self.ntok] = self.ctx[:self.ntok]
            self.ctx = ctx
        if len(token_ids) > self.ntok:
            self.ctx[self.ntok:len(token_ids)] = token_ids[self.ntok:]
            self.ntok = len(token_ids)

    def fill(self, token_ids: list[int]) -> None:
        """Payloads now known: x_{j+2} for fed positions j with j + 2 < len(token_ids)."""
        new, pos = [], self.pos_np
        while self.known + len(new) < self.n and pos[self.known + len(new)] + 2 < len(token_ids):
            new.append(token_ids[pos[self.known + len(new)] + 2])
        if new:
            self.set_payload(self.known, new)
            self.known += len(new)
