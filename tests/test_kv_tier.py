"""The second KV tier's bookkeeping (torch-free): what an eviction stores, what a lookup finds in the
tier and loads back, swap out and in, pinning within a step, and the swap-or-recompute estimate."""
from __future__ import annotations

import pytest

from ridgeline.engine.kv_manager import KVCacheManager
from ridgeline.engine.kv_tier import SwapCosts, TierIndex
from ridgeline.engine.prefix_cache import block_hashes

BS = 4


def _kv(num_blocks=5, slots=4, **kw):
    return KVCacheManager(num_blocks, BS, enable_caching=True, tier=TierIndex("cpu", slots, 100, SwapCosts(**kw)))


def _fill(kv, rid, tokens):
    m = kv.match(tokens)
    assert kv.allocate(rid, len(tokens), prefix=m)
    kv.cache_blocks(rid, tokens, len(tokens))
    return m


def test_evicted_block_is_stored_then_found_and_loaded_back():
    kv = _kv()
    a = list(range(9))  # two full blocks + one token
    _fill(kv, "a", a)
    table_a = list(kv.tables["a"])
    kv.free("a")
    kv.tier.drain()
    _fill(kv, "b", list(range(100, 116)))  # 4 blocks: evicts a's two cached blocks into the tier
    copies = kv.tier.drain()
    assert sorted(b for b, _ in copies.stores) == sorted(table_a[:2]) and not copies.loads
    assert kv.stats.evictions == 2 and kv.tier.stats.stores == 2
    kv.free("b")
    m = kv.match(a)
    assert m.blocks == [] and len(m.tier_slots) == 2 and m.num_tokens == 8
    assert kv.allocate("a2", 9, prefix=m)
    copies = kv.tier.drain()
    assert [s for s, _ in copies.loads] == m.tier_slots
    assert [b for _, b in copies.loads] == kv.tables["a2"][:2]
    assert kv.tier.stats.hits == 8 and kv.stats.hits == 8
    assert all(b in kv.cache for b in kv.tables["a2"][:2])  # back in the pool's prefix cache
    kv.check_integrity()
    kv.free("a2")
    again = kv.match(a)
    assert len(again.blocks) == 2 and not again.tier_slots  # a pool hit now
    assert all(h in kv.tier.lru for h in block_hashes(a, BS))  # and the tier kept its copy


def test_tier_is_inclusive_and_a_reevicted_block_is_not_stored_twice():
    kv = _kv()
    a = list(range(9))
    _fill(kv, "a", a)
    kv.free("a")
    _fill(kv, "b", list(range(100, 116)))
    kv.free("b")
    _fill(kv, "a2", a)
    loaded = kv.tables["a2"][:2]
    kv.free("a2")
    kv.tier.drain()
    _fill(kv, "c", list(range(200, 216)))  # evicts a's blocks again: already in the tier
    assert kv.stats.evictions >= 6
    assert not {b for b, _ in kv.tier.drain().stores} & set(loaded)
    assert all(h in kv.tier.lru for h in block_hashes(a, BS))
    kv.check_integrity()


def test_slot_read_this_step_is_not_reused_by_a_store_of_the_same_step():
    kv = _kv(num_blocks=4, slots=2)
    a = list(range(9))
    _fill(kv, "a", a)
    kv.free("a")
    _fill(kv, "b", list(range(100, 112)))  # 3 blocks: a's 2 go to the tier's 2 slots
    kv.free("b")
    kv.tier.drain()
    m = kv.match(a)
    assert len(m.tier_slots) == 2
    assert kv.allocate("a2", 9, prefix=m)  # takes 3 blocks: evicts b's cached blocks; tier slots pinned
    copies = kv.tier.drain()
    assert not {s for _, s in copies.stores} & set(m.tier_slots)
    assert kv.tier.stats.dropped >= 1
    kv.check_integrity()


def test_swap_out_and_in():
    kv = KVCacheManager(6, BS, enable_caching=False, tier=TierIndex("disk", 4, 100, SwapCosts("swap")))
    assert kv.allocate("r", 10)
    table = list(kv.tables["r"])
    assert kv.swap_out("r", 10)
    assert "r" not in kv.tables and kv.num_free_blocks == 5
    copies = kv.tier.drain()
    assert [b for b, _ in copies.stores] == table and not copies.loads
    m = kv.swapped_match("r")
    assert m.swapped and m.num_tokens == 10 and len(m.tier_slots) == 3
    assert kv.allocate("r", 11, prefix=m)
    copies = kv.tier.drain()
    assert [b for _, b in copies.loads] == kv.tables["r"][:3] and kv.tier.stats.swaps_in == 1
    assert kv.swapped_match("r") is None and len(kv.tier.free_slots) == 4
    kv.check_integrity()


def test_swap_out_without_room_falls_back_and_drop_releases():
    kv = KVCacheManager(8, BS, tier=TierIndex("cpu", 2, 100, SwapCosts("swap")))
    assert kv.allocate("r", 12) and kv.allocate("s", 8)
    assert not kv.swap_out("r", 12)  # 3 blocks, 2 slots: released for recompute
    assert kv.tier.stats.swap_fallbacks == 1 and "r" not in kv.tables
    assert kv.swap_out("s", 8)
    kv.drop_swapped("s")
    kv.tier.drain()
    assert len(kv.tier.free_slots) == 2
    kv.check_integrity()


def test_swap_or_recompute_follows_the_measured_rates():
    c = SwapCosts("auto", bytes_per_s=1e9, prefill_tokens_per_s=1000)
    assert c.prefer_swap(100, 10_000_000)  # 20 ms of copies vs 100 ms of prefill
    for _ in range(50):
        c.observe_copy(1_000_000, 1.0)  # a slow tier: 1 MB/s
    assert not c.prefer_swap(100, 10_000_000)
    for _ in range(50):
        c.observe_prefill(10, 1.0)  # an even slower prefill
    assert c.prefer_swap(100, 10_000)
    assert SwapCosts("recompute").prefer_swap(10**6, 1) is False
    with pytest.raises(ValueError, match="preemption_mode"):
        SwapCosts("sometimes")
