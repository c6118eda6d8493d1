"""Cache-aware routing end to end on simulated replicas (tests/routing_sim.py: the router's real
policy, index and load accounting; simulated time, FCFS replicas with LRU pools, delayed KV events):
8 tenants x 6 requests arriving interleaved over 2 replicas whose pools hold about half the tenants'
prefixes, from idle to queues far longer than the index's grace period."""
from __future__ import annotations

from collections import Counter

import pytest

from routing_sim import BS, TEMPLATE, SimRequest, hit_rate, simulate, tenant_workload

from ridgeline.engine.prefix_cache import block_hashes
from ridgeline.router.policy import Route

TENANTS, PER_TENANT, PREFIX_BLOCKS = 8, 6, 64
POOL = int(4.5 * (PREFIX_BLOCKS + 4))  # ~4.5 tenants' prompts per replica

# (seconds between arrivals, prefill tokens/s): idle, queued, queued for minutes
LOADS = {"idle": (2.0, 1000.0), "busy": (0.2, 1000.0), "queued-for-minutes": (10.0, 20.0)}


def run(policy: str, load: str, seed: int = 0):
    gap, rate = LOADS[load]
    return simulate(policy, tenant_workload(TENANTS, PER_TENANT, PREFIX_BLOCKS, gap, seed), pool_blocks=POOL,
                    rate=rate)


@pytest.mark.parametrize("load", list(LOADS))
@pytest.mark.parametrize("seed", [0, 1])
def test_each_tenant_gets_a_home_and_the_hit_rate_is_near_the_ideal(load, seed):
    reqs = run("cache-aware", load, seed)
    homes = {t: Counter(r.replica for r in reqs if r.tenant == t) for t in range(TENANTS)}
    assert all(len(c) == 1 for c in homes.values()), homes
    per_replica = Counter(next(iter(c)) for c in homes.values())
    assert sorted(per_replica.values()) == [4, 4], "the first requests (misses) split evenly"
    ideal = sum(PREFIX_BLOCKS * 16 + 16 for r in reqs[TENANTS:]) / sum(r.route.num_tokens for r in reqs)
    assert hit_rate(reqs) >= 0.95 * ideal
    assert all(r.predicted == r.cached for r in reqs), "the index agrees with what the replicas held"
    rr = run("round-robin", load, seed)
    assert hit_rate(reqs) >= 1.6 * hit_rate(rr)
    shares = Counter(r.replica for r in reqs)
    assert max(shares.values()) <= 0.65 * len(reqs)


def test_round_robin_thrashes_pools_that_hold_half_the_tenants():
    reqs = run("round-robin", "idle")
    assert hit_rate(reqs) < 0.4


def test_a_hot_tenant_overflows_to_the_other_replica_only_past_the_load_bound():
    """Half the traffic from one tenant at a rate one replica cannot serve: its home takes it until
    that replica's queue is far above the mean, then the other replica shares it."""
    reqs = []
    for i in range(80):
        t = 0 if i % 2 == 0 else 1 + (i // 2) % 7
        ids = TEMPLATE + [t * 100_000 + j for j in range(PREFIX_BLOCKS * BS)] + \
            [10_000_000 + i * 100 + j for j in range(40)]
        reqs.append(SimRequest(t, Route(len(ids), block_hashes(ids[:-1], BS), BS), i * 0.05))
    simulate("cache-aware", reqs, pool_blocks=POOL, rate=1000.0, decode_s=0.5)
    shares = Counter(r.replica for r in reqs)
    assert max(shares.values()) <= 0.65 * len(reqs)
    hot = Counter(r.replica for r in reqs if r.tenant == 0)
    assert len(hot) == 2, "the hot tenant overflowed"
