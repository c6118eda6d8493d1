"""Prefix cache in the KV manager, with exact block ids: hits, caps, eviction order, ref counts, salts."""
import pytest

from ridgeline.engine.kv_manager import KVCacheManager
from ridgeline.engine.prefix_cache import PrefixCacheIndex, chain_keys


def run(kv: KVCacheManager, rid: str, ids: list[int], salt=None):
    """Admit ids (taking any cached prefix), compute them all, cache the full blocks."""
    match = kv.match(ids, salt)
    assert kv.allocate(rid, len(ids), prefix=match)
    kv.cache_blocks(rid, ids, len(ids), salt)
    return match


def test_hit_reuses_blocks_and_caps_at_prompt_minus_one():
    kv = KVCacheManager(10, 4, enable_caching=True)
    a = list(range(1, 11))  # 2 full blocks + 2 tokens
    assert run(kv, "a", a).num_tokens == 0
    assert kv.tables["a"] == [1, 2, 3]
    kv.free("a")
    assert list(kv.evictable) == [2, 1] and list(kv.free_ids) == [4, 5, 6, 7, 8, 9, 3]
    m = run(kv, "b", a[:8] + [99])  # both full blocks hit, the rest computed
    assert (m.blocks, m.num_tokens, m.num_queried) == ([1, 2], 8, 9)
    assert kv.tables["b"] == [1, 2, 4] and not kv.evictable
    kv.free("b")
    m = kv.match(a[:8])  # 8 tokens = 2 full blocks, but the last token must be computed: 1 block
    assert m.blocks == [1] and m.num_tokens == 4
    assert kv.stats.queries == 10 + 9 and kv.stats.hits == 8
    kv.check_integrity()


def test_partial_hit_stops_at_the_first_different_block():
    kv = KVCacheManager(12, 4, enable_caching=True)
    run(kv, "a", list(range(1, 14)))  # blocks 1, 2, 3 cached; 4 holds the 13th token
    kv.free("a")
    b = [1, 2, 3, 4, 5, 6, 0, 8, 9, 10, 11, 12, 13]  # differs inside the second block
    m = run(kv, "b", b)
    assert m.blocks == [1] and kv.tables["b"] == [1, 5, 6, 7]
    # the tail of a (blocks 2, 3) stays cached: a third request can still hit all of a's blocks
    assert kv.match(list(range(1, 14))).blocks == [1, 2, 3]
    kv.check_integrity()


def test_two_running_requests_share_blocks_with_ref_counts():
    kv = KVCacheManager(10, 4, enable_caching=True)
    prompt = list(range(1, 10))
    run(kv, "a", prompt)  # [1, 2, 3]
    run(kv, "b", prompt)  # hits 1, 2 while a still runs
    assert kv.tables["b"] == [1, 2, 4]
    assert kv.ref_counts[1:5] == [2, 2, 1, 1]
    kv.free("a")
    assert kv.ref_counts[1:5] == [1, 1, 0, 1] and not kv.evictable and 3 in kv.free_ids
    assert kv.num_used_blocks == 3
    kv.check_integrity()
    kv.free("b")
    assert list(kv.evictable) == [2, 1] and kv.num_used_blocks == 0 and kv.num_cached_blocks == 2
    kv.check_integrity()


def test_lazy_eviction_least_recently_released_first_tails_first():
    kv = KVCacheManager(7, 2, enable_caching=True)  # 6 usable blocks
    run(kv, "a", [1, 2, 3, 4, 5])  # [1, 2, 3]; 1, 2 cached
    run(kv, "b", [7, 8, 9, 10, 11])  # [4, 5, 6]; 4, 5 cached
    kv.free("a")
    kv.free("b")
    assert list(kv.free_ids) == [3, 6]  # uncached tails: reused before anything is evicted
    assert list(kv.evictable) == [2, 1, 5, 4]  # a before b; within each, the tail first
    assert kv.allocate("c", 6)  # 3 blocks: the two free ones, then evict a's tail block
    assert kv.tables["c"] == [3, 6, 2] and kv.stats.evictions == 1
    assert kv.match([1, 2, 3, 4, 5]).blocks == [1]  # a's head block survived
    assert kv.allocate("c", 10)  # 2 more: evict 1, then 5
    assert kv.tables["c"] == [3, 6, 2, 1, 5] and list(kv.evictable) == [4]
    assert kv.match([1, 2, 3, 4, 5]).blocks == [] and kv.match([7, 8, 9]).blocks == [4]
    assert kv.stats.evictions == 3
    kv.check_integrity()


def test_hit_on_evictable_blocks_counts_against_free_blocks():
    kv = KVCacheManager(4, 2, enable_caching=True)  # 3 usable
    run(kv, "a", [1, 2, 3, 4, 5])
    kv.free("a")  # 1, 2 cached, 3 free
    m = kv.match([1, 2, 3, 4, 9, 9, 9])  # 2 blocks hit; needs 2 more but only 1 block is left
    assert not kv.allocate("b", 7, prefix=m)
    assert "b" not in kv.tables or kv.tables["b"] == []
    assert list(kv.evictable) == [2, 1] and kv.stats.queries == 5
    assert kv.allocate("b", 5, prefix=m) and kv.tables["b"] == [1, 2, 3]
    kv.check_integrity()


def test_cache_salt_isolates_tenants():
    kv = KVCacheManager(16, 4, enable_caching=True)
    prompt = list(range(1, 14))
    run(kv, "plain", prompt)
    kv.free("plain")
    assert kv.match(prompt, salt="tenant-a").blocks == []
    run(kv, "a", prompt, salt="tenant-a")
    kv.free("a")
    assert kv.match(prompt, salt="tenant-a").blocks == [5, 6, 7]
    assert kv.match(prompt, salt="tenant-b").blocks == []
    assert kv.match(prompt).blocks == [1, 2, 3]
    kv.check_integrity()


def test_duplicate_blocks_stay_uncached_and_generated_tokens_cache_too():
    kv = KVCacheManager(12, 4, enable_caching=True)
    prompt = [5, 6, 7, 8, 9]
    kv.allocate("a", 5, prefix=kv.match(prompt))
    kv.allocate("b", 5, prefix=kv.match(prompt))  # both computed at once: no hit yet
    kv.cache_blocks("a", prompt, 5)
    kv.cache_blocks("b", prompt, 5)
    assert 1 in kv.cache and 3 not in kv.cache  # b's block 3 duplicates a's block 1
    tokens = prompt + [10, 11, 12]  # 3 generated tokens fill a's second block
    kv.cache_blocks("a", tokens, 8)
    kv.free("a")
    kv.free("b")
    assert 3 in kv.free_ids and list(kv.evictable) == [2, 1]
    assert kv.match(tokens + [13]).blocks == [1, 2]
    kv.check_integrity()


def test_caching_off_keeps_plain_paging():
    kv = KVCacheManager(8, 4)
    assert not kv.caching
    ids = list(range(1, 10))
    run(kv, "a", ids)
    kv.free("a")
    assert kv.match(ids).blocks == [] and not kv.evictable and kv.num_free_blocks == 7
    kv.check_integrity()


def test_reset_prefix_cache_and_integrity_catches_bad_states():
    kv = KVCacheManager(8, 4, enable_caching=True)
    run(kv, "a", list(range(1, 10)))
    kv.free("a")
    kv.check_integrity()
    kv.evictable[3] = None  # an uncached block in the evictable list (3 is also free)
    with pytest.raises(AssertionError):
        kv.check_integrity()
    del kv.evictable[3]
    assert kv.reset_prefix_cache() == 2 and len(kv.cache) == 0 and kv.num_free_blocks == 7
    kv.check_integrity()
    run(kv, "b", list(range(1, 10)))
    kv.ref_counts[kv.tables["b"][0]] += 1
    with pytest.raises(AssertionError):
        kv.check_integrity()


def test_a_hash_collision_is_a_miss():
    index = PrefixCacheIndex()
    (h, key), = chain_keys([1, 2], 2, 0, 1, None)
    assert index.add(7, h, key)
    assert index.get(h, key) == 7
    assert index.get(h, (None, (1, 3), None)) is None  # same hash, other tokens: never served
    assert not index.add(8, h, key)  # one block per content
    index.remove(7)
    assert index.get(h, key) is None and len(index) == 0


def test_block_hashes_are_the_same_in_every_process():
    import subprocess
    import sys
    from ridgeline.engine.prefix_cache import block_hashes
    ids = list(range(40))
    here = [block_hashes(ids, 16), block_hashes(ids, 16, salt="tenant-a")]
    code = ("from ridgeline.engine.prefix_cache import block_hashes; ids = list(range(40)); "
            "print([h.hex() for h in block_hashes(ids, 16) + block_hashes(ids, 16, salt='tenant-a')])")
    for seed in ("1", "2"):  # other string-hash seeds: nothing may depend on Python's hash()
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env={**__import__("os").environ, "PYTHONHASHSEED": seed}).stdout
        assert out.strip() == str([h.hex() for h in here[0] + here[1]])
    assert len(here[0]) == 2 and here[0] != here[1]  # full blocks only; the salt changes every later block
    assert block_hashes(ids[:16] + [7] * 16, 16)[0] == here[0][0]  # a block depends on its prefix only
    assert block_hashes([1] + ids[1:32], 16)[1] != here[0][1]  # ... and on all of it
