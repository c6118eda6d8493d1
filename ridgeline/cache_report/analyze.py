"""Offline prefix-cache analysis of a list of prompts in arrival order. Torch-free.

- share_fraction: f, the fraction of prompt tokens an unbounded prefix cache would serve (full
  blocks already seen, chained and salted like the engine, capped at prompt - 1).
- simulate: the hit rate with a given KV capacity, by running the engine's own KVCacheManager (and,
  with tier_tokens, its second tier: hits found there are reported apart).
- divergences: for the most common first blocks, where prompts that start alike stop agreeing,
  what differs there, and how much agrees again after it (what a varying field costs the cache).
"""
from __future__ import annotations

from collections import Counter, defaultdict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from ridgeline.engine.kv_manager import KVCacheManager
from ridgeline.engine.kv_tier import TierIndex
from ridgeline.engine.prefix_cache import chain_keys

_SPAN = 256  # longest differing span searched for re-alignment
_RUN = 8  # tokens that must agree again to count as re-aligned


def cacheable_blocks(num_tokens: int, block_size: int) -> int:
    """Full blocks a hit may cover: the last prompt token is always computed."""
    return max(0, num_tokens - 1) // block_size


def share_fraction(prompts: Sequence[Sequence[int]], block_size: int,
                   salts: Sequence[str | None] | None = None) -> float:
    seen: set[int] = set()
    hit = total = 0
    for i, ids in enumerate(prompts):
        total += len(ids)
        salt = salts[i] if salts else None
        hashes = [h for h, _ in chain_keys(ids, block_size, 0, cacheable_blocks(len(ids), block_size), None, salt)]
        n = next((k for k, h in enumerate(hashes) if h not in seen), len(hashes))
        hit += n * block_size
        seen.update(hashes)
    return hit / total if total else 0.0


@dataclass
class SimResult:
    capacity_tokens: int
    requests: int = 0
    prompt_tokens: int = 0
    hit_tokens: int = 0  # prefill tokens saved
    evictions: int = 0
    too_long: int = 0  # prompts larger than the whole capacity (not simulated)
    tier_capacity_tokens: int = 0  # the second KV tier's capacity (0: none)
    tier_hit_tokens: int = 0  # of hit_tokens, those the second tier held
    tier_loads: int = 0  # blocks loaded back from the second tier
    tier_stores: int = 0  # blocks written to it (evicted from the cache)

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def simulate(prompts: Sequence[Sequence[int]], block_size: int, capacity_tokens: int, concurrency: int = 1,
             salts: Sequence[str | None] | None = None, tier_tokens: int = 0) -> SimResult:
    """Serve prompts in order through a KVCacheManager of capacity_tokens (whole blocks) and a second
    tier of tier_tokens (0: none); at most `concurrency` requests hold their blocks at once (the
    oldest is released first). Outputs are not in the log, so only prompt blocks are cached: a lower
    bound where replies are resent."""
    tier = TierIndex("offload", tier_tokens // block_size, 0) if tier_tokens >= block_size else None
    kv = KVCacheManager(capacity_tokens // block_size + 1, block_size, enable_caching=True, tier=tier)
    res = SimResult(kv.num_usable_blocks * block_size, tier_capacity_tokens=tier.num_slots * block_size if tier else 0)
    held: deque[str] = deque()
    for i, ids in enumerate(prompts):
        if kv.blocks_for(len(ids)) > kv.num_usable_blocks:
            res.too_long += 1
            continue
        while len(held) >= max(1, concurrency):
            kv.free(held.popleft())
        salt = salts[i] if salts else None
        match = kv.match(ids, salt)
        rid = str(i)
        while not kv.allocate(rid, len(ids), prefix=match):
            kv.free(held.popleft())  # cannot run dry: the prompt fits an empty cache
        kv.cache_blocks(rid, ids, len(ids), salt)
        if tier is not None:
            tier.drain()  # no runner: the copies are only counted
        held.append(rid)
        res.requests += 1
        res.prompt_tokens += len(ids)
    res.hit_tokens, res.evictions = kv.stats.hits, kv.stats.evictions
    if tier is not None:
        res.tier_hit_tokens, res.tier_loads, res.tier_stores = tier.stats.hits, tier.stats.loads, tier.stats.stores
    return res


@dataclass
class Divergence:
    position: int  # first token index where the prompt differs from the group's first prompt
    reference: list[int]  # the reference's differing tokens there
    other: list[int]  # this prompt's differing tokens
    agree_after: int  # tokens that agree again right after the differing spans


@dataclass
class PrefixGroup:
    first_block: list[int]
    count: int
    reference: list[int]  # token ids of the group's first prompt
    divergences: list[Divergence] = field(default_factory=list)

    @property
    def common_position(self) -> int | None:
        """The most frequent divergence position, or None if every prompt equals the reference."""
        if not self.divergences:
            return None
        return Counter(d.position for d in self.divergences).most_common(1)[0][0]

    def example(self) -> Divergence | None:
        """At the most common position: the divergence that costs the most re-agreeing tokens."""
        at = [d for d in self.divergences if d.position == self.common_position]
        return max(at, key=lambda d: d.agree_after) if at else None


def divergences(prompts: Sequence[Sequence[int]], block_size: int, top: int = 5,
                max_per_group: int = 200) -> list[PrefixGroup]:
    """The `top` most common first blocks shared by two prompts or more; each other prompt of a group
    (up to max_per_group) compared with the group's first."""
    members: dict[tuple[int, ...], list[int]] = defaultdict(list)
    for i, ids in enumerate(prompts):
        if len(ids) > block_size:
            members[tuple(ids[:block_size])].append(i)
    ranked = sorted((m for m in members.values() if len(m) > 1), key=len, reverse=True)[:top]
    groups = []
    for idx in ranked:
        ref = list(prompts[idx[0]])
        group = PrefixGroup(ref[:block_size], len(idx), ref)
        for i in idx[1:max_per_group + 1]:
            d = _diverge(ref, list(prompts[i]))
            if d is not None:
                group.divergences.append(d)
        groups.append(group)
    return groups


def _diverge(a: list[int], b: list[int]) -> Divergence | None:
    """Where b first differs from a, and the shortest differing spans after which _RUN tokens agree."""
    p = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    if p == len(a) == len(b):
        return None
    grams: dict[tuple[int, ...], int] = {}
    for j in range(p, min(len(b) - _RUN, p + _SPAN) + 1):
        grams.setdefault(tuple(b[j:j + _RUN]), j)
    for i in range(p, min(len(a) - _RUN, p + _SPAN) + 1):
        j = grams.get(tuple(a[i:i + _RUN]))
        if j is not None:
            n = next((k for k, (x, y) in enumerate(zip(a[i:], b[j:])) if x != y), min(len(a) - i, len(b) - j))
            return Divergence(p, a[p:i], b[p:j], n)
    return Divergence(p, a[p:p + _SPAN], b[p:p + _SPAN], 0)
