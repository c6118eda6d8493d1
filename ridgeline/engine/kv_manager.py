"""Paged KV-cache bookkeeping: a pool of fixed-size blocks, ref counts, one block table per request.

Torch-free. Invariant (check_integrity): every block is either free (ref 0, in the free list) or
used (ref >= 1); free + used == total. Block 0 is never handed out: padded block tables point at it.
"""
from __future__ import annotations

from collections import deque


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 2:
            raise ValueError(f"the KV cache needs at least 2 blocks, got {num_blocks}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.ref_counts = [0] * num_blocks
        self.free_ids: deque[int] = deque(range(1, num_blocks))
        self.tables: dict[str, list[int]] = {}

    @property
    def num_usable_blocks(self) -> int:
        return self.num_blocks - 1

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_ids)

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_usable_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def num_new_blocks(self, req_id: str, num_tokens: int) -> int:
        return max(0, self.blocks_for(num_tokens) - len(self.tables.get(req_id, ())))

    def allocate(self, req_id: str, num_tokens: int, reserve: int = 0) -> bool:
        """Grow req_id's table to hold num_tokens; False (and no change) if fewer than
        needed + reserve blocks are free."""
        need = self.num_new_blocks(req_id, num_tokens)
        if need + reserve > len(self.free_ids):
            return False
        table = self.tables.setdefault(req_id, [])
        for _ in range(need):
            block = self.free_ids.popleft()
            self.ref_counts[block] = 1
            table.append(block)
        return True

    def share(self, src_id: str, dst_id: str, num_tokens: int) -> int:
        """Give dst the full blocks of src covering its first num_tokens tokens; returns tokens shared."""
        assert not self.tables.get(dst_id), "share into an empty table only"
        blocks = self.tables[src_id][: num_tokens // self.block_size]
        for b in blocks:
            self.ref_counts[b] += 1
        self.tables[dst_id] = list(blocks)
        return len(blocks) * self.block_size

    def free(self, req_id: str) -> None:
        """Release a request's blocks, tail first, so the tail is the first to be reused."""
        for block in reversed(self.tables.pop(req_id, [])):
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                self.free_ids.append(block)

    def check_integrity(self) -> None:
        refs = [0] * self.num_blocks
        for table in self.tables.values():
            for b in table:
                refs[b] += 1
        assert refs == self.ref_counts, "ref counts disagree with block tables"
        free = set(self.free_ids)
        assert len(free) == len(self.free_ids), "a block is in the free list twice"
        assert 0 not in free and self.ref_counts[0] == 0, "block 0 is reserved for padding"
        used = {b for b in range(1, self.num_blocks) if self.ref_counts[b] > 0}
        assert free.isdisjoint(used) and len(free) + len(used) == self.num_usable_blocks, \
            f"free {len(free)} + used {len(used)} != total {self.num_usable_blocks}"
