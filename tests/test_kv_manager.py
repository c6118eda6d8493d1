"""Block pool bookkeeping with exact block ids."""
import pytest

from ridgeline.engine.kv_manager import KVCacheManager


def test_allocate_grows_tables_with_exact_ids():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    assert kv.allocate("a", 5)  # 2 blocks
    assert kv.tables["a"] == [1, 2]
    assert kv.allocate("b", 4)
    assert kv.tables["b"] == [3]
    assert kv.allocate("a", 8)  # still 2 blocks
    assert kv.tables["a"] == [1, 2]
    assert kv.allocate("a", 9)
    assert kv.tables["a"] == [1, 2, 4]
    assert kv.num_free_blocks == 3
    kv.check_integrity()


def test_allocation_failure_changes_nothing():
    kv = KVCacheManager(num_blocks=4, block_size=4)
    assert kv.allocate("a", 8)
    assert not kv.allocate("b", 8)
    assert "b" not in kv.tables or kv.tables["b"] == []
    assert not kv.allocate("c", 4, reserve=1)
    assert kv.num_free_blocks == 1
    kv.check_integrity()


def test_free_returns_tail_first_so_tails_are_reused_first():
    kv = KVCacheManager(num_blocks=6, block_size=2)
    kv.allocate("a", 6)  # [1, 2, 3]
    kv.free("a")
    assert list(kv.free_ids) == [4, 5, 3, 2, 1]
    kv.allocate("b", 2)
    assert kv.tables["b"] == [4]
    kv.check_integrity()


def test_share_full_blocks_and_ref_counts():
    kv = KVCacheManager(num_blocks=10, block_size=4)
    kv.allocate("p", 10)  # [1, 2, 3]
    assert kv.share("p", "c", 9) == 8  # only the two full blocks
    assert kv.tables["c"] == [1, 2]
    assert kv.ref_counts[1] == kv.ref_counts[2] == 2 and kv.ref_counts[3] == 1
    kv.allocate("c", 11)
    assert kv.tables["c"] == [1, 2, 4]
    kv.free("p")
    assert kv.ref_counts[1] == 1 and 3 in kv.free_ids and 1 not in kv.free_ids
    kv.free("c")
    assert kv.num_free_blocks == kv.num_usable_blocks
    kv.check_integrity()


def test_integrity_catches_corruption():
    kv = KVCacheManager(num_blocks=4, block_size=4)
    kv.allocate("a", 4)
    kv.ref_counts[1] = 2
    with pytest.raises(AssertionError):
        kv.check_integrity()


def test_needs_two_blocks():
    with pytest.raises(ValueError):
        KVCacheManager(num_blocks=1, block_size=4)
