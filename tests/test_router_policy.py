"""Routing decisions on a synthetic KV index: round-robin, least-load, cache-aware (affinity, misses
spread, affinity lost past the load bound only), and the index's pending entries."""
from __future__ import annotations

import pytest

from ridgeline.engine.prefix_cache import block_hashes
from ridgeline.errors import InvalidRequestError
from ridgeline.router.kv_index import KVIndex
from ridgeline.router.policy import POLICIES, Route, create_policy
from ridgeline.router.replica import Replica, Ticket

BS = 16


def replicas(n: int = 2) -> list[Replica]:
    return [Replica(f"http://r{i}") for i in range(n)]


def route(tenant: int, suffix: int = 0, prefix_blocks: int = 8) -> Route:
    ids = [tenant * 1000 + i for i in range(prefix_blocks * BS)] + [suffix] * 5
    return Route(len(ids), block_hashes(ids[:-1], BS), BS)


def test_registry_names_and_unknown_policy():
    assert set(POLICIES) >= {"round-robin", "least-load", "cache-aware"}
    with pytest.raises(InvalidRequestError, match="unknown routing policy 'nope'"):
        create_policy("nope")


def test_round_robin_cycles_whatever_the_load():
    rs = replicas(3)
    rs[0].waiting_tokens = 10_000
    p = create_policy("round-robin")
    assert [p.choose(rs, Route()).url for _ in range(6)] == [r.url for r in rs] * 2


def test_least_load_counts_tokens_not_requests():
    rs = replicas(2)
    Ticket(rs[0], 900)  # one long prompt waiting
    for _ in range(3):
        Ticket(rs[1], 10)  # three short ones
    p = create_policy("least-load")
    assert p.choose(rs, Route()) is rs[1]
    rs[1].waiting_tokens = 900
    assert p.choose(rs, Route()) is rs[0], "equal tokens: fewer requests in flight"
    idle = replicas(2)
    assert {p.choose(idle, Route()).url for _ in range(4)} == {r.url for r in idle}, "ties spread"


def test_ticket_moves_prompt_tokens_to_running_then_away():
    r = Replica("http://r")
    t = Ticket(r, 500)
    assert (r.waiting_tokens, r.running, r.in_flight) == (500, 0, 1)
    t.first_token()
    assert (r.waiting_tokens, r.running) == (0, 1)
    t.end()
    t.end()
    assert (r.waiting_tokens, r.running, r.in_flight, r.routed) == (0, 0, 0, 1)


def test_cache_aware_follows_the_prefix_holder():
    rs, index = replicas(2), KVIndex()
    p = create_policy("cache-aware", index)
    index.stored(rs[1].name, route(7).hashes[:5])
    assert p.choose(rs, route(7, 1)) is rs[1]
    assert p.expected_hit(rs[1], route(7, 1)) == 5 * BS
    assert p.expected_hit(rs[0], route(7, 1)) == 0
    index.removed(rs[1].name, route(7).hashes[2:3])  # a hole: only the blocks before it match
    assert p.expected_hit(rs[1], route(7, 1)) == 2 * BS


def test_cache_aware_spreads_misses_by_load():
    rs, index = replicas(2), KVIndex()
    p = create_policy("cache-aware", index)
    chosen = []
    for tenant in range(8):  # every request a miss: each lands where the queued work is least
        r = p.choose(rs, route(tenant))
        Ticket(r, route(tenant).num_tokens)
        chosen.append(r.url)
    assert chosen.count(rs[0].url) == chosen.count(rs[1].url) == 4


def test_cache_aware_affinity_yields_to_the_load_bound():
    rs, index = replicas(2), KVIndex()
    p = create_policy("cache-aware", index, slack=0.5, min_skew=100)
    index.stored(rs[0].name, route(1).hashes)
    r = route(1, 9)
    rs[0].waiting_tokens, rs[1].waiting_tokens = 100, 0  # below the bound, and the hit saves more
    assert p.choose(rs, r) is rs[0]
    rs[0].waiting_tokens = 5000  # far above (1 + slack) x mean: its affinity is gone
    assert p.choose(rs, r) is rs[1]


def test_pending_entries_last_while_the_request_is_in_flight_then_a_grace_period():
    now = [0.0]
    rs, index = replicas(2), KVIndex(grace=10, clock=lambda: now[0])
    p = create_policy("cache-aware", index)
    hs = route(3).hashes
    first = p.choose(rs, route(3))
    index.expect(first.name, hs)
    assert p.choose(rs, route(3, 2)) is first, "before the replica's events arrive"
    now[0] = 1000.0  # queued for long on a loaded replica: still expected there
    assert p.expected_hit(first, route(3, 2)) == 8 * BS
    index.expect(first.name, hs)  # a second request of the prefix, then the first ends
    index.settle(first.name, hs)
    now[0] = 2000.0
    assert p.expected_hit(first, route(3, 2)) == 8 * BS, "one request still in flight"
    index.settle(first.name, hs)
    now[0] = 2009.0
    assert p.expected_hit(first, route(3, 2)) == 8 * BS, "within the grace period"
    now[0] = 2011.0
    assert p.expected_hit(first, route(3, 2)) == 0, "ended, and no event ever confirmed it"


def test_events_confirm_pending_entries_and_never_cancel_in_flight_ones():
    rs, index = replicas(2), KVIndex(grace=0)
    p = create_policy("cache-aware", index)
    hs = route(3).hashes
    index.stored(rs[0].name, hs)
    index.expect(rs[0].name, hs)
    index.removed(rs[0].name, hs)  # an older copy left the pool: the request in flight stores it again
    assert p.expected_hit(rs[0], route(3, 1)) == 8 * BS
    index.reset(rs[0].name)  # a resync keeps the claims of requests in flight
    assert p.expected_hit(rs[0], route(3, 1)) == 8 * BS
    index.stored(rs[0].name, hs)
    index.settle(rs[0].name, hs)
    assert not index.pending[rs[0].name] and p.expected_hit(rs[0], route(3, 1)) == 8 * BS
    index.settle(rs[0].name, hs)  # settling twice changes nothing
    index.removed(rs[0].name, hs)
    assert p.expected_hit(rs[0], route(3, 1)) == 0


def test_affinity_survives_a_queue_one_prefix_longer_and_yields_to_real_imbalance():
    rs, index = replicas(2), KVIndex()
    p = create_policy("cache-aware", index)
    r = route(1, 9, prefix_blocks=64)  # a 1,024-token prefix held by replica 0
    index.stored(rs[0].name, r.hashes)
    rs[0].waiting_tokens, rs[1].waiting_tokens = 1500, 0  # one queued miss more: a greedy TTFT pick moves
    assert p.choose(rs, r) is rs[0]
    rs[0].waiting_tokens, rs[1].waiting_tokens = 9000, 7200  # a long queue on both, 25% apart
    assert p.choose(rs, r) is rs[0]
    rs[0].waiting_tokens, rs[1].waiting_tokens = 4000, 500  # far above the mean: the bound
    assert p.choose(rs, r) is rs[1]


def test_a_shared_template_block_does_not_pull_every_miss_to_one_replica():
    rs, index = replicas(2), KVIndex()
    p = create_policy("cache-aware", index)
    template = route(0).hashes[:1]
    index.stored(rs[0].name, template)  # replica 0 served one request: it holds the common head
    index.stored(rs[0].name, [b"tenant 0 block %d" % i for i in range(60)])
    head = [i for i in range(BS)]  # route(0)'s first block, then a prefix of another tenant
    ids = head + [5000 + i for i in range(64 * BS)]
    miss = Route(len(ids), block_hashes(ids[:-1], BS), BS)
    assert p.expected_hit(rs[0], miss) == BS
    assert p.choose(rs, miss) is rs[1], "idle replicas: the one holding fewer blocks takes the new prefix"


def test_index_reset_replaces_a_replicas_blocks():
    index = KVIndex()
    hs = route(1).hashes
    index.stored("a", hs)
    index.stored("b", hs[:2])
    index.reset("a", hs[:1])
    assert index.held["a"] == {hs[0]} and index.owners[hs[1]] == {"b"}
    index.reset("b")
    assert hs[1] not in index.owners and index.owners[hs[0]] == {"a"}
