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

KV groups (ridgeline/kv_groups.py: layers mixing local and global attention): a request has one table
per group over the one pool (group 0 global, the others each with its window), every page belongs to one
group's table at a time, and a local group's blocks behind its window are released as above (its holes).
A page cached by one group is found only by that group's lookups (one index per group); a prefix hit
needs group 0's blocks up to it and each local group's blocks of the window before it. `tables` and
`holes` are group 0's; `group_tables` / `group_holes` all of them.

With a second tier (`tier`, engine/kv_tier.py) an evicted cached block is offered to it, a lookup
continues there after the pool, and a preempted request may swap its blocks out; the tier records
the copies, the runner makes them.
"""
from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence

from ridgeline.engine.kv_tier import TierIndex
from ridgeline.engine.prefix_cache import BlockHash, PrefixCacheIndex, PrefixCacheStats, PrefixMatch, chain_keys
from ridgeline.kv_groups import KVGroups


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = False, window: int | None = None,
                 tier: TierIndex | None = None, groups: KVGroups | None = None):
        """window: every layer's (one table); groups: a table per KV group instead (window then None)."""
        if num_blocks < 2:
            raise ValueError(f"the KV cache needs at least 2 blocks, got {num_blocks}")
        assert groups is None or (window is None and tier is None), "KV groups have their own windows, no tier"
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.ref_counts = [0] * num_blocks
        self.free_ids: deque[int] = deque(range(1, num_blocks))
        self.evictable: OrderedDict[int, None] = OrderedDict()  # cached, ref 0; LRU first
        self.groups = groups
        self.windows: tuple[int | None, ...] = groups.windows if groups is not None else (window,)
        n = len(self.windows)
        self.group_tables: list[dict[str, list[int]]] = [{} for _ in range(n)]
        self.tables = self.group_tables[0]
        self.caches = [PrefixCacheIndex() for _ in range(n)] if enable_caching else None
        self.cache = self.caches[0] if enable_caching else None
        self.page_group = [0] * num_blocks  # the group whose table a page is in (or was cached by)
        self.block_hashes: dict[str, list[BlockHash]] = {}  # request -> hashes of its first full, computed blocks
        self.stats = PrefixCacheStats()
        # per group: request -> blocks released at the start of its table
        self.group_holes: list[dict[str, int]] = [{} for _ in range(n)]
        self.holes = self.group_holes[0]
        self.tier = tier

    @property
    def window(self) -> int | None:
        """Every layer's window, with one table (None: no window, or KV groups with their own)."""
        return None if self.groups is not None else self.windows[0]

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
        need = self.blocks_for(num_tokens)
        return sum(max(0, need - len(t.get(req_id, ()))) for t in self.group_tables)

    def pages_for(self, num_tokens: int) -> int:
        """Pages a request of num_tokens holds: a block of every group per block of tokens (one group: as
        many as its blocks), a local group's capped by its window."""
        if self.groups is None:
            return self.blocks_for(num_tokens)
        return self.groups.peak_pages(num_tokens, 1, self.block_size)  # a decode step's

    def peak_pages(self, num_tokens: int, chunk: int, budget: int | None = None) -> int:
        """Pages one request of num_tokens holds at most (chunk: the largest step; budget: KV eviction's)."""
        if self.groups is not None:
            return self.groups.peak_pages(num_tokens, chunk, self.block_size)
        from ridgeline.engine.kv_eviction import peak_tokens
        return self.blocks_for(peak_tokens(num_tokens, self.window, chunk, self.block_size, budget))

    def seq_tables(self, req_id: str, num_tokens: int | None = None) -> tuple[list[int], list[list[int]]]:
        """Copies of req_id's table covering num_tokens (None: all of it), and of the other groups' tables."""
        cut = None if num_tokens is None else self.blocks_for(num_tokens)
        tables = [list(t[req_id][:cut]) for t in self.group_tables]
        return tables[0], tables[1:]

    def held_slots(self, req_id: str) -> tuple[int, int]:
        """(blocks held over every group, of them released behind a window: holes)."""
        held = sum(len(t.get(req_id, ())) for t in self.group_tables)
        return held, sum(h.get(req_id, 0) for h in self.group_holes)

    # ---- prefix cache --------------------------------------------------------------------------
    def match(self, token_ids: Sequence[int], salt: str | None = None) -> PrefixMatch:
        """The longest run of cached full blocks at the start of token_ids, leaving at least the last
        token to compute (its logits are needed). Changes nothing; `allocate(prefix=...)` takes it."""
        blocks: list[int] = []
        hashes: list[BlockHash] = []
        slots, keys, block_keys = [], [], []  # block_keys: every matched block's key (KV groups look them up)
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
                block_keys.append(key)
        if self.groups is not None and hashes:
            return self._group_match(len(token_ids), blocks, hashes, block_keys)
        return PrefixMatch(blocks, hashes, len(hashes) * self.block_size, len(token_ids), slots, keys)

    def _group_match(self, num_queried: int, blocks: list[int], hashes: list[BlockHash], keys: list) -> PrefixMatch:
        """Group 0 holds the first len(blocks) blocks (keys: theirs); a hit of n blocks also needs every
        other global group's first n blocks and every local group's blocks from the first its window reaches
        at position n * block_size. The largest such n."""
        bs, n = self.block_size, len(blocks)
        found = [[self.caches[k].get(h, key) for h, key in zip(hashes, keys)] for k in range(1, len(self.windows))]
        while n:
            firsts = [0 if w is None else max(0, n * bs - w + 1) // bs for w in self.windows[1:]]
            if all(all(f[first:n]) for f, first in zip(found, firsts)):
                break
            n -= 1
        group_blocks = [[0] * first + f[first:n] for f, first in zip(found, firsts)] if n else []
        return PrefixMatch(blocks[:n], hashes[:n], n * bs, num_queried, group_blocks=group_blocks)

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
            i = len(hashes)
            for cache, tables in zip(self.caches, self.group_tables):
                block = tables[req_id][i] if i < len(tables[req_id]) else 0
                if block:  # a local group's block released behind its window stays uncached
                    cache.add(block, h, key)  # a duplicate of a cached block stays uncached
            hashes.append(h)

    def reset_prefix_cache(self) -> int:
        """Forget every cached block nobody uses; returns how many."""
        n = len(self.evictable) + (self.tier.clear() if self.tier is not None else 0)
        while self.evictable:
            block, _ = self.evictable.popitem(last=False)
            self.caches[self.page_group[block]].remove(block)
            self.free_ids.append(block)
        return n

    # ---- allocation ----------------------------------------------------------------------------
    def allocate(self, req_id: str, num_tokens: int, reserve: int = 0, prefix: PrefixMatch | None = None) -> bool:
        """Grow req_id's tables to hold num_tokens, starting with prefix's cached blocks (into empty
        tables only); False (and no change) if fewer than needed + reserve blocks are free."""
        hit = prefix.blocks if prefix is not None else []
        loads = prefix.tier_slots if prefix is not None else []
        hits = [hit, *(prefix.group_blocks if prefix is not None and prefix.group_blocks else [[]] * (len(self.windows) - 1))]
        assert not ((hit or loads) and self.tables.get(req_id)), "a prefix goes into an empty table only"
        if loads:
            self.tier.pin(loads)  # before any eviction below can reuse them
        # cached blocks leaving `evictable`
        revived = sum(1 for blocks in hits for b in blocks if b and self.ref_counts[b] == 0)
        need = max(0, self.num_new_blocks(req_id, num_tokens) - sum(map(len, hits)))
        if need + revived + reserve > self.num_free_blocks:
            return False
        for k, (tables, blocks) in enumerate(zip(self.group_tables, hits)):
            table = tables.setdefault(req_id, [])
            for block in blocks:
                if block:
                    if self.ref_counts[block] == 0:
                        del self.evictable[block]
                    self.ref_counts[block] += 1
                table.append(block)
            holes = next((i for i, b in enumerate(blocks) if b), len(blocks))  # a local hit's holes lead
            if holes:
                self.group_holes[k][req_id] = holes
        if prefix is not None and not prefix.swapped:
            self.block_hashes[req_id] = list(prefix.hashes)
            self.stats.queries += prefix.num_queried
            self.stats.hits += prefix.num_tokens
        target = self.blocks_for(num_tokens)
        new = []
        for k, tables in enumerate(self.group_tables):
            table = tables[req_id]
            grown = [self._take(k) for _ in range(target - len(table))]
            table.extend(grown)
            if k == 0:
                new = grown
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

    def _take(self, group: int = 0) -> int:
        if self.free_ids:
            block = self.free_ids.popleft()
        else:
            block, _ = self.evictable.popitem(last=False)
            cache = self.caches[self.page_group[block]]
            if self.tier is not None:
                self.tier.offer(block, *cache.entries[block])
            cache.remove(block)
            self.stats.evictions += 1
        self.ref_counts[block] = 1
        self.page_group[block] = group
        return block

    def release_behind(self, req_id: str, position: int) -> int:
        """The query at `position` reaches back window - 1 keys in each windowed group: release req_id's
        blocks wholly before that, in every such group; returns how many."""
        return sum(self.release_before(req_id, position - w + 1, k) for k, w in enumerate(self.windows) if w)

    def release_before(self, req_id: str, first_needed: int, group: int = 0) -> int:
        """Release req_id's blocks wholly before token first_needed in one group's table (holes stay in
        the table); returns how many."""
        table = self.group_tables[group].get(req_id)
        holes = self.group_holes[group]
        done = holes.get(req_id, 0)
        upto = min(max(first_needed, 0) // self.block_size, len(table) if table else 0)
        if upto <= done:
            return 0
        for i in range(done, upto):  # oldest first: the first to be evicted again
            self._release(table[i])
            table[i] = 0
        holes[req_id] = upto
        return upto - done

    def held_blocks(self, req_id: str) -> int:
        held, holes = self.held_slots(req_id)
        return held - holes

    def held_blocks_in(self, req_id: str, group: int) -> int:
        return len(self.group_tables[group].get(req_id, ())) - self.group_holes[group].get(req_id, 0)

    def _release(self, block: int) -> None:
        self.ref_counts[block] -= 1
        if self.ref_counts[block] == 0:
            if self.caches is not None and block in self.caches[self.page_group[block]]:
                self.evictable[block] = None  # most recently released: evicted last
            else:
                self.free_ids.append(block)

    def share(self, src_id: str, dst_id: str, num_tokens: int) -> int:
        """Give dst the full blocks of src covering its first num_tokens tokens; returns tokens shared."""
        assert not self.tables.get(dst_id), "share into an empty table only"
        n = num_tokens // self.block_size
        for tables, holes in zip(self.group_tables, self.group_holes):
            blocks = tables[src_id][:n]
            for b in blocks:
                if b:
                    self.ref_counts[b] += 1
            tables[dst_id] = list(blocks)
            held = min(holes.get(src_id, 0), len(blocks))
            if held:
                holes[dst_id] = held
        return n * self.block_size

    def shrink(self, req_id: str, num_tokens: int) -> int:
        """Release the blocks of req_id's tables past those num_tokens tokens need (tail first, as free()
        does): slots held for proposals that were rejected. They hold no computed token, so none is
        cached. Returns how many blocks were released."""
        keep, n = self.blocks_for(num_tokens), 0
        for tables in self.group_tables:
            table = tables.get(req_id)
            if table is None or len(table) <= keep:
                continue
            released = table[keep:]
            del table[keep:]
            for block in reversed(released):
                self._release(block)
            n += len(released)
        return n

    def free(self, req_id: str) -> None:
        """Release a request's blocks, tail first: the tail is the first to be reused or evicted (the
        local groups' before group 0's, which a later prefix hit needs most)."""
        self.block_hashes.pop(req_id, None)
        for tables, holes in reversed(list(zip(self.group_tables, self.group_holes))):
            skip = holes.pop(req_id, 0)
            for block in reversed(tables.pop(req_id, [])[skip:]):
                self._release(block)

    def check_integrity(self) -> None:
        refs = [0] * self.num_blocks
        for k, (tables, holes_of) in enumerate(zip(self.group_tables, self.group_holes)):
            assert tables.keys() == self.tables.keys(), f"group {k}: tables of other requests than group 0's"
            for rid, table in tables.items():
                holes = holes_of.get(rid, 0)
                assert len(table) == len(self.tables[rid]), f"{rid}: group {k}'s table is not group 0's length"
                assert 0 not in table[holes:], f"{rid}: a hole after a held block"
                assert not any(table[:holes]), f"{rid}: a released block is still in its table"
                for b in table[holes:]:
                    refs[b] += 1
                    assert self.page_group[b] == k, f"{rid}: block {b} is in group {k}'s table, not its own"
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
        if self.caches is None:
            assert not cached, "cached blocks without a prefix cache"
            return
        entries = {}
        for k, cache in enumerate(self.caches):
            cache.check()
            for b in cache.entries:
                assert b not in entries, f"block {b} is cached by two groups"
                assert self.page_group[b] == k, f"block {b} is cached by group {k}, not its own"
                entries[b] = k
        assert all(b in entries for b in cached), "an evictable block is not in the prefix cache"
        assert all(b in cached or b in used for b in entries), "a free block is still cached"
        for rid, hashes in self.block_hashes.items():
            for k, (tables, cache) in enumerate(zip(self.group_tables, self.caches)):
                table = tables.get(rid, ())
                assert len(hashes) <= len(table), f"{rid}: hashes beyond its table"
                for block, h in zip(table, hashes):
                    assert not block or block not in cache or cache.entries[block][0] == h, \
                        f"{rid}: block {block} is cached under another hash"
