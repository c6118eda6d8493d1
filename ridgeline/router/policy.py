"""Routing policies: a registry of classes that pick one replica for a request.

A policy sees the replicas that are up (never an empty list), the request's prompt as block hashes
(`Route`) and the KV index. A new policy (e.g. prefill/decode pairs) is one class here:
`@register_policy("name")`, `choose(replicas, route) -> Replica`.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from ridgeline.engine.prefix_cache import BlockHash
from ridgeline.errors import InvalidRequestError
from ridgeline.router.kv_index import KVIndex
from ridgeline.router.replica import Replica

POLICIES: dict[str, type] = {}


def register_policy(name: str):
    def deco(cls):
        cls.name = name
        POLICIES[name] = cls
        return cls
    return deco


def create_policy(name: str, index: KVIndex | None = None, **options):
    if name not in POLICIES:
        raise InvalidRequestError(f"unknown routing policy {name!r}; known: {', '.join(POLICIES)}", "policy")
    return POLICIES[name](index=index, **options)


@dataclass(frozen=True)
class Route:
    """What a policy knows of a request: its prompt's tokens and the hashes of its full blocks (those a
    hit can cover: never the last token), empty when the router could not tokenize it."""
    num_tokens: int = 0
    hashes: list[BlockHash] = field(default_factory=list)
    block_size: int = 16


class Policy:
    name = ""

    def __init__(self, index: KVIndex | None = None, **_):
        self.index = index
        self._turn = itertools.count()

    def choose(self, replicas: list[Replica], route: Route) -> Replica:
        raise NotImplementedError

    def expected_hit(self, replica: Replica, route: Route) -> int:
        """Prompt tokens the chosen replica is expected to serve from its cache (0 without an index)."""
        return 0

    def _rotate(self, replicas: list[Replica]) -> list[Replica]:
        """The replicas starting at the next turn's: ties then spread instead of piling on the first."""
        k = next(self._turn) % len(replicas)
        return replicas[k:] + replicas[:k]


@register_policy("round-robin")
class RoundRobin(Policy):
    def choose(self, replicas: list[Replica], route: Route) -> Replica:
        return self._rotate(replicas)[0]


@register_policy("least-load")
class LeastLoad(Policy):
    """Fewest queued tokens (then fewest requests in flight)."""

    def choose(self, replicas: list[Replica], route: Route) -> Replica:
        return min(self._rotate(replicas), key=lambda r: (r.load, r.in_flight))


@register_policy("cache-aware")
class CacheAware(Policy):
    """Least cost, where a replica's cost is the estimated work before this request's first token
    (its queued tokens plus the prompt tokens it would compute past the prefix it holds) plus the
    prefix tokens it would duplicate (those another replica already holds: computing them again
    costs the prompt now and, in a pool that holds only some tenants' prefixes, evicts another
    tenant's blocks that a later request then recomputes). So a tenant stays on its home replica
    until that replica's queue is about two prefixes longer than another's, not one.

    A match shorter than min_share of the prompt (a chat template's head that every prompt shares)
    counts as none: such a request is a miss, and a miss goes to the least loaded replica, then the
    one holding the fewest blocks, so new prefixes spread over the pools instead of all following
    the one replica that happens to hold the template. A replica whose load is above (1 + slack) x
    the mean (and more than min_skew tokens above it) loses its affinity: it competes on load
    alone, which bounds the skew a popular prefix can cause."""

    def __init__(self, index: KVIndex | None = None, slack: float = 0.5, min_skew: int = 1024,
                 min_share: float = 0.3, **_):
        super().__init__(index)
        self.slack = slack
        self.min_skew = min_skew
        self.min_share = min_share

    def choose(self, replicas: list[Replica], route: Route) -> Replica:
        raw = self._hits(replicas, route)
        mean = sum(r.load for r in replicas) / len(replicas)
        bound = max((1 + self.slack) * mean, mean + self.min_skew)
        floor = self.min_share * route.num_tokens
        hits = {r.name: raw[r.name] if r.load <= bound and raw[r.name] >= floor else 0 for r in replicas}
        best = max(hits.values())

        def cost(r: Replica) -> tuple:
            hit = hits[r.name]
            held = self.index.footprint(r.name) if self.index is not None else 0
            return r.load + route.num_tokens - hit + best - hit, held, r.in_flight

        return min(self._rotate(replicas), key=cost)

    def expected_hit(self, replica: Replica, route: Route) -> int:
        return self._hits([replica], route)[replica.name]

    def _hits(self, replicas: list[Replica], route: Route) -> dict[str, int]:
        if self.index is None or not route.hashes:
            return {r.name: 0 for r in replicas}
        blocks = self.index.matched_blocks(route.hashes, [r.name for r in replicas])
        return {name: n * route.block_size for name, n in blocks.items()}
