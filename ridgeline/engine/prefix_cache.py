"""Prefix cache index: full KV blocks keyed by a chained hash of their contents. Torch-free.

A block's key is (parent hash, its token ids, extra keys). Extra keys are set on the first block
only (the request's cache salt), and every later key contains its parent's hash, so two requests
share block i only if they agree on tokens 0..(i+1)*block_size and on the salt. The index keeps
each cached block's whole key and a lookup compares it: a hash collision is a miss, never wrong KV.

The hash is a content hash (SHA-256 over the parent's digest, the tokens as little-endian int64
and the salt), the same in every process and on every machine: a router or another engine can
compute a request's block hashes from its token ids alone (`block_hashes`).

The index holds no ref counts and no free lists: KVCacheManager decides when a block enters (its
tokens are all computed) and leaves (it is evicted to hold other tokens).
"""
from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

BlockHash = bytes  # 32-byte SHA-256 digest
BlockKey = tuple  # (parent hash | None, tuple of block_size token ids, extra keys | None)
_ROOT = bytes(32)  # the parent digest of a sequence's first block


@dataclass
class PrefixMatch:
    """What a lookup found: cached blocks holding the first num_tokens tokens, in table order."""
    blocks: list[int]
    hashes: list[BlockHash]  # chained hash of each block in `blocks`
    num_tokens: int  # len(blocks) * block_size (+ the tier's blocks)
    num_queried: int  # the request's tokens at lookup: the hit-rate denominator
    # second KV tier (engine/kv_tier.py): blocks after `blocks`, loaded back from these slots into new
    # pool blocks; their hashes follow in `hashes`, their keys in tier_keys. swapped: a preempted
    # request's own blocks (no hashes), num_tokens its computed tokens
    tier_slots: list[int] = field(default_factory=list)
    tier_keys: list[BlockKey] = field(default_factory=list)
    swapped: bool = False
    # KV groups: each local group's blocks for the same tokens, 0 where its window does not reach (holes)
    group_blocks: list[list[int]] = field(default_factory=list)


@dataclass
class PrefixCacheStats:
    """Monotonic counters, for Prometheus and reports."""
    queries: int = 0  # tokens looked up: a request's length, once per admission (readmissions too)
    hits: int = 0  # of those, tokens served from cached blocks
    evictions: int = 0  # cached blocks taken back to hold other tokens

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


def hash_block(parent: BlockHash | None, tokens: Sequence[int], salt: str | None = None) -> BlockHash:
    """The stable content hash of one full block given its parent's hash (None for the first block)."""
    h = hashlib.sha256(parent or _ROOT)
    h.update(struct.pack(f"<{len(tokens)}q", *tokens))
    if salt is not None:  # tokens have a fixed length, so the salt's bytes cannot alias them
        h.update(b"salt\0" + salt.encode("utf-8", "surrogatepass"))
    return h.digest()


def chain_keys(token_ids: Sequence[int], block_size: int, first: int, last: int, parent: BlockHash | None,
               salt: str | None = None) -> Iterator[tuple[BlockHash, BlockKey]]:
    """(hash, key) of full blocks first..last-1 of token_ids; parent is block first-1's hash."""
    for i in range(first, last):
        extra = ("salt", salt) if i == 0 and salt is not None else None
        tokens = tuple(token_ids[i * block_size:(i + 1) * block_size])
        key = (parent, tokens, extra)
        parent = hash_block(parent, tokens, salt if i == 0 else None)
        yield parent, key


def block_hashes(token_ids: Sequence[int], block_size: int, salt: str | None = None) -> list[BlockHash]:
    """The hashes of every full block of token_ids, as any engine with this block size keys them."""
    return [h for h, _ in chain_keys(token_ids, block_size, 0, len(token_ids) // block_size, None, salt)]


class PrefixCacheIndex:
    def __init__(self):
        self.by_hash: dict[BlockHash, int] = {}  # hash -> block id
        self.entries: dict[int, tuple[BlockHash, BlockKey]] = {}  # block id -> (hash, key)
        self.events = None  # a KVEventRecorder (engine/kv_events.py) told of every add and remove, or None

    def __contains__(self, block: int) -> bool:
        return block in self.entries

    def __len__(self) -> int:
        return len(self.entries)

    def get(self, h: BlockHash, key: BlockKey) -> int | None:
        block = self.by_hash.get(h)
        if block is None or self.entries[block][1] != key:
            return None
        return block

    def add(self, block: int, h: BlockHash, key: BlockKey) -> bool:
        """False if that content is already cached in another block (this one then stays uncached)."""
        if h in self.by_hash or block in self.entries:
            return False
        self.by_hash[h] = block
        self.entries[block] = (h, key)
        if self.events is not None:
            self.events.stored(h)
        return True

    def remove(self, block: int) -> None:
        h, _ = self.entries.pop(block)
        del self.by_hash[h]
        if self.events is not None:
            self.events.removed(h)

    def check(self) -> None:
        assert len(self.by_hash) == len(self.entries), "hash map and entries disagree"
        for block, (h, key) in self.entries.items():
            parent, tokens, extra = key
            assert self.by_hash.get(h) == block and hash_block(parent, tokens, extra and extra[1]) == h, \
                f"block {block}: stale hash entry"
