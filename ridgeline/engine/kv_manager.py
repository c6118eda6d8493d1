"""Paged KV-cache bookkeeping: a pool of fixed-size blocks, ref counts, one block table per request,
and (enable_caching) a prefix cache over full blocks. Torch-free.

Every usable block is in exactly one state (check_integrity):
- free:      ref 0, holds nothing reusable; in free_ids (taken first).
- cached:    ref 0, holds a full block of computed tokens in the prefix cache; in `evictable`, least
             recently released first. Taken only when free_ids is empty (lazy eviction).
- used:      ref >= 1, in the tables of that many requests.
free + cached + used == total. Block 0 is never handed out: padded block tables point at it.
A request's table is released tail first, so its tail blocks are the first to be reused or evicted.

Sliding windows (window: the keys any layer's query reaches, when every layer has a window): blocks
wholly before a request's first needed key are released as it moves on (`release_before`) and its
table keeps a 0 in their place (a hole: never read, never counted), so its blocks stay bounded by the
window. Holes are a prefix of the table. A released block that is cached stays servable: a later
request that matches it matches every block before its own start, so it never needs a hole.

With a second tier (`tier`, engine/kv_tier.py) an evicted cached block is offered to it, a lookup
continues there after the pool, and a preempted request may swap its blocks out; the tier records
the copies, the runner makes them.
"""
from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence

from ridgeline.engine.kv_tier import TierIndex
from ridgeline.engine.prefix_cache import BlockHash, PrefixCacheIndex, PrefixCacheStats, PrefixMatch, chain_keys


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = False, window: int | None = None,
                 tier: TierIndex | None = None):
        if num_blocks < 2:
            raise ValueError(f"the KV cache needs at least 2 blocks, got {num_blocks}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.ref_counts = [0] * num_blocks
        self.free_ids: deque[int] = deque(range(1, num_blocks))
        self.evictable: OrderedDict[int, None] = OrderedDict()  # cached, ref 0; LRU first
        self.tables: dict[str, list[int]] = {}
        self.cache = PrefixCacheIndex() if enable_caching else None
        self.block_hashes: dict[str, list[BlockHash]] = {}  # request -> hashes of its first full, computed blocks
        self.stats = PrefixCacheStats()
        self.window = window
        self.holes: dict[str, int] = {}  # request -> blocks released at the start of its table
        self.tier = tier

    @property
    def caching(self) -> bool:
        return self.cache is not None

    @property
    def num_usable_blocks(self) -> int:
        return self.num_blocks - 1

    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation can take: free ones, then cached ones nobody uses (evicted)."""
        return len(self.free_ids) + len(self.evictable)

    @property
    def num_cached_blocks(self) -> int:
        """Cached blocks no request uses (evictable)."""
        return len(self.evictable)

    @property
    def num_used_blocks(self) -> int:
        return self.num_usable_blocks - self.num_free_blocks

    @property
    def usage(self) -> float:
        return self.num_used_blocks / self.num_usable_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def num_new_blocks(self, req_id: str, num_tokens: int) -> int:
        return max(0, self.blocks_for(num_tokens) - len(self.tables.get(req_id, ())))

    # ---- prefix cache --------------------------------------------------------------------------
    def match(self, token_ids: Sequence[int], salt: str | None = None) -> PrefixMatch:
        """The longest run of cached full blocks at the start of token_ids, leaving at least the last
        token to compute (its logits are needed). Changes nothing; `allocate(prefix=...)` takes it."""
        blocks: list[int] = []
        hashes: list[BlockHash] = []
        slots, keys = [], []
        if self.cache is not None:
            for h, key in chain_keys(token_ids, self.block_size, 0, (len(token_ids) - 1) // self.block_size,
                                     None, salt):
                block = None if slots else self.cache.get(h, key)  # the pool's run, then the tier's
                slot = None if block is not None or self.tier is None else self.tier.lookup(h, key)
                if block is None and slot is None:
                    break
                if block is not None:
                    blocks.append(block)
                else:
                    slots.append(slot)
                    keys.append(key)
                hashes.append(h)
        return PrefixMatch(blocks, hashes, len(hashes) * self.block_size, len(token_ids), slots, keys)

    def cache_blocks(self, req_id: str, token_ids: Sequence[int], num_computed: int,
                     salt: str | None = None) -> None:
        """Enter req_id's full blocks of computed tokens (token_ids[:num_computed]) into the cache."""
        table = self.tables.get(req_id)
        if self.cache is None or table is None:
            return
        hashes = self.block_hashes.setdefault(req_id, [])
        full = min(num_computed // self.block_size, len(table))
        if full <= len(hashes):
            return
        parent = hashes[-1] if hashes else None
        for h, key in chain_keys(token_ids, self.block_size, len(hashes), full, parent, salt):
            self.cache.add(table[len(hashes)], h, key)  # a duplicate of a cached block stays uncached
            hashes.append(h)

    def reset_prefix_cache(self) -> int:
        """Forget every cached block nobody uses; returns how many."""
        n = len(self.evictable) + (self.tier.clear() if self.tier is not None else 0)
        while self.evictable:
            block, _ = self.evictable.popitem(last=False)
            self.cache.remove(block)
            self.free_ids.append(block)
        return n

    # ---- allocation ----------------------------------------------------------------------------
    def allocate(self, req_id: str, num_tokens: int, reserve: int = 0, prefix: PrefixMatch | None = None) -> bool:
        """Grow req_id's table to hold num_tokens, starting with prefix's cached blocks (into an empty
        table only); False (and no change) if fewer than needed + reserve blocks are free."""
        hit = prefix.blocks if prefix is not None else []
        loads = prefix.tier_slots if prefix is not None else []
        assert not ((hit or loads) and self.tables.get(req_id)), "a prefix goes into an empty table only"
        if loads:
            self.tier.pin(loads)  # before any eviction below can reuse them
        revived = sum(1 for b in hit if self.ref_counts[b] == 0)  # cached blocks leaving `evictable`
        need = max(0, self.num_new_blocks(req_id, num_tokens) - len(hit))
        if need + revived + reserve > self.num_free_blocks:
            return False
        table = self.tables.setdefault(req_id, [])
        for block in hit:
            if self.ref_counts[block] == 0:
                del self.evictable[block]
            self.ref_counts[block] += 1
            table.append(block)
        if prefix is not None and not prefix.swapped:
            self.block_hashes[req_id] = list(prefix.hashes)
            self.stats.queries += prefix.num_queried
            self.stats.hits += prefix.num_tokens
        new = [self._take() for _ in range(need)]
        table.extend(new)
        if loads:
            self._load_from_tier(req_id, prefix, new[:len(loads)])
        return True

    def _load_from_tier(self, req_id: str, prefix: PrefixMatch, blocks: list[int]) -> None:
        if prefix.swapped:
            self.tier.swap_in(req_id, blocks)
            return
        self.tier.load_hits(prefix.tier_slots, blocks)
        self.tier.stats.hits += len(blocks) * self.block_size
        for block, h, key in zip(blocks, prefix.hashes[len(prefix.blocks):], prefix.tier_keys):
            self.cache.add(block, h, key)  # cached as soon as the step's copies have run

    # ---- swap (second tier) --------------------------------------------------------------------
    def swap_out(self, req_id: str, num_tokens: int) -> bool:
        """Release req_id's blocks, their first num_tokens computed tokens stored in the tier first;
        False if there is no tier or it lacks room (the blocks are released all the same)."""
        blocks = list(self.tables.get(req_id, ())[:self.blocks_for(num_tokens)])
        self.free(req_id)
        return self.tier is not None and bool(blocks) and self.tier.swap_out(req_id, blocks, num_tokens)

    def swapped_match(self, req_id: str) -> PrefixMatch | None:
        """What a swapped-out request resumes from (allocate(prefix=...) loads it), or None."""
        entry = self.tier.swapped.get(req_id) if self.tier is not None else None
        if entry is None:
            return None
        return PrefixMatch([], [], entry.num_tokens, 0, list(entry.slots), swapped=True)

    def drop_swapped(self, req_id: str) -> None:
        if self.tier is not None:
            self.tier.forget(req_id)

    def _take(self) -> int:
        if self.free_ids:
            block = self.free_ids.popleft()
        else:
            block, _ = self.evictable.popitem(last=False)
            if self.tier is not None:
                self.tier.offer(block, *self.cache.entries[block])
            self.cache.remove(block)
            self.stats.evictions += 1
        self.ref_counts[block] = 1
        return block

    def release_before(self, req_id: str, first_needed: int) -> int:
        """Release req_id's blocks wholly before token first_needed (holes stay in the table); returns how many."""
        table = self.tables.get(req_id)
        done = self.holes.get(req_id, 0)
        upto = min(max(first_needed, 0) // self.block_size, len(table) if table else 0)
        if upto <= done:
            return 0
        for i in range(done, upto):  # oldest first: the first to be evicted again
            self._release(table[i])
            table[i] = 0
        self.holes[req_id] = upto
        return upto - done

    def held_blocks(self, req_id: str) -> int:
        return len(self.tables.get(req_id, ())) - self.holes.get(req_id, 0)

    def _release(self, block: int) -> None:
        self.ref_counts[block] -= 1
        if self.ref_counts[block] == 0:
            if self.cache is not None and block in self.cache:
                self.evictable[block] = None  # most recently released: evicted last
            else:
                self.free_ids.append(block)

    def share(self, src_id: str, dst_id: str, num_tokens: int) -> int:
        """Give dst the full blocks of src covering its first num_tokens tokens; returns tokens shared."""
        assert not self.tables.get(dst_id), "share into an empty table only"
        blocks = self.tables[src_id][: num_tokens // self.block_size]
        for b in blocks:
            if b:
                self.ref_counts[b] += 1
        self.tables[dst_id] = list(blocks)
        holes = min(self.holes.get(src_id, 0), len(blocks))
        if holes:
            self.holes[dst_id] = holes
        return len(blocks) * self.block_size

    def shrink(self, req_id: str, num_tokens: int) -> int:
        """Release the blocks of req_id's table past those num_tokens tokens need (tail first, as free()
        does): slots held for proposals that were rejected. They hold no computed token, so none is
        cached. Returns how many blocks were released."""
        table = self.tables.get(req_id)
        keep = self.blocks_for(num_tokens)
        if table is None or len(table) <= keep:
            return 0
        released = table[keep:]
        del table[keep:]
        for block in reversed(released):
            self._release(block)
        return len(released)

    def free(self, req_id: str) -> None:
        """Release a request's blocks, tail first: the tail is the first to be reused or evicted."""
        self.block_hashes.pop(req_id, None)
        holes = self.holes.pop(req_id, 0)
        for block in reversed(self.tables.pop(req_id, [])[holes:]):
            self._release(block)

    def check_integrity(self) -> None:
        refs = [0] * self.num_blocks
        for rid, table in self.tables.items():
            holes = self.holes.get(rid, 0)
            assert 0 not in table[holes:], f"{rid}: a hole after a held block"
            assert not any(table[:holes]), f"{rid}: a released block is still in its table"
            for b in table[holes:]:
                refs[b] += 1
        assert refs == self.ref_counts, "ref counts disagree with block tables"
        free, cached = set(self.free_ids), set(self.evictable)
        assert len(free) == len(self.free_ids), "a block is in the free list twice"
        assert 0 not in free | cached and self.ref_counts[0] == 0, "block 0 is reserved for padding"
        used = {b for b in range(1, self.num_blocks) if self.ref_counts[b] > 0}
        assert free.isdisjoint(used) and cached.isdisjoint(used) and free.isdisjoint(cached), \
            "a block is in two states"
        assert len(free) + len(cached) + len(used) == self.num_usable_blocks, \
            f"free {len(free)} + cached {len(cached)} + used {len(used)} != total {self.num_usable_blocks}"
        if self.tier is not None:
            self.tier.check()
        if self.cache is None:
            assert not cached, "cached blocks without a prefix cache"
            return
        self.cache.check()
        assert all(b in self.cache for b in cached), "an evictable block is not in the prefix cache"
        assert all(b in cached or b in used for b in self.cache.entries), "a free block is still cached"
        for rid, hashes in self.block_hashes.items():
            table = self.tables.get(rid, ())
            assert len(hashes) <= len(table), f"{rid}: hashes beyond its table"
            for block, h in zip(table, hashes):
                assert block not in self.cache or self.cache.entries[block][0] == h, f"{rid}: block {block} " \
                    "is cached under another hash"
