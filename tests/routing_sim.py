"""A deterministic discrete-event simulation of replicas behind the router's real policy, KV index
and load accounting (Router.admit / Ticket): each replica serves its queue first come first served
at a fixed prefill rate, keeps an LRU pool of full blocks, and publishes stored / removed events that
reach the index after a delay. Time is simulated: no sleeps, no threads."""
from __future__ import annotations

import heapq
import itertools
import random
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from ridgeline.engine.prefix_cache import block_hashes
from ridgeline.router.core import Router, RouterSettings
from ridgeline.router.policy import Route
from ridgeline.router.replica import Replica

BS = 16
TEMPLATE = list(range(900_000, 900_000 + BS))  # every prompt's first block (a chat template's head)


@dataclass
class SimRequest:
    tenant: int
    route: Route
    arrival: float
    replica: str = ""
    predicted: int = 0  # prompt tokens the router expected the replica to hold
    cached: int = 0  # prompt tokens the replica served from its pool
    ttft: float = 0.0


def tenant_workload(tenants: int, per_tenant: int, prefix_blocks: int, gap: float, seed: int = 0,
                    suffix: int = 40) -> list[SimRequest]:
    """per_tenant rounds, each every tenant once in a shuffled order, one arrival every `gap` s;
    a prompt is the template block, the tenant's prefix, then a question of its own."""
    rng = random.Random(seed)
    out = []
    for rnd in range(per_tenant):
        order = list(range(tenants))
        rng.shuffle(order)
        for t in order:
            ids = TEMPLATE + [t * 100_000 + i for i in range(prefix_blocks * BS)] + \
                [10_000_000 + len(out) * 1000 + i for i in range(suffix)]
            out.append(SimRequest(t, Route(len(ids), block_hashes(ids[:-1], BS), BS), len(out) * gap))
    return out


@dataclass
class SimReplica:
    replica: Replica
    pool_blocks: int
    pool: OrderedDict = field(default_factory=OrderedDict)  # hash -> None, least recently used first
    queue: deque = field(default_factory=deque)
    busy: bool = False

    def serve(self, req: SimRequest) -> tuple[int, list, list]:
        """Prefill req now: (tokens served from the pool, hashes stored, hashes evicted)."""
        hit = 0
        for h in req.route.hashes:
            if h not in self.pool:
                break
            self.pool.move_to_end(h)
            hit += 1
        stored, removed = [], []
        for h in req.route.hashes[hit:]:
            self.pool[h] = None
            stored.append(h)
        while len(self.pool) > self.pool_blocks:
            h, _ = self.pool.popitem(last=False)
            removed.append(h)
        return hit * BS, stored, removed


def simulate(policy: str, requests: list[SimRequest], replicas: int = 2, pool_blocks: int = 300,
             rate: float = 1000.0, decode_s: float = 0.05, event_delay: float = 0.5) -> list[SimRequest]:
    """Route and serve every request; fills each request's replica, predicted, cached and ttft."""
    now = [0.0]
    router = Router([Replica(f"http://r{i}") for i in range(replicas)], RouterSettings(policy))
    if router.index is not None:
        router.index.clock = lambda: now[0]
    sims = {r.name: SimReplica(r, pool_blocks) for r in router.replicas}
    heap, seq = [], itertools.count()

    def at(t: float, *what) -> None:
        heapq.heappush(heap, (t, next(seq), what))

    def start(sim: SimReplica) -> None:
        if sim.busy or not sim.queue:
            return
        req, ticket = sim.queue.popleft()
        sim.busy = True
        req.cached, stored, removed = sim.serve(req)
        first = now[0] + (req.route.num_tokens - req.cached) / rate
        at(first, "first", sim, req, ticket)
        at(first + event_delay, "events", sim.replica.name, [("stored", stored), ("removed", removed)])

    for req in requests:
        at(req.arrival, "arrive", req)
    while heap:
        now[0], _, what = heapq.heappop(heap)
        kind = what[0]
        if kind == "arrive":
            req = what[1]
            chosen = router.pick(req.route, set())
            ticket = router.admit(chosen, req.route)
            req.replica, req.predicted = chosen.name, ticket.expected_hit
            sims[chosen.name].queue.append((req, ticket))
            start(sims[chosen.name])
        elif kind == "first":
            _, sim, req, ticket = what
            req.ttft = now[0] - req.arrival
            ticket.first_token()
            at(now[0] + decode_s, "end", sim, ticket)
        elif kind == "end":
            _, sim, ticket = what
            ticket.end()
            sim.busy = False
            start(sim)
        elif kind == "events" and router.index is not None:
            router.index.apply(what[1], [(k, hs) for k, hs in what[2] if hs])
    return requests


def hit_rate(requests: list[SimRequest]) -> float:
    return sum(r.cached for r in requests) / sum(r.route.num_tokens for r in requests)
