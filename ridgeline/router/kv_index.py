"""Which replica holds which prefix block: hash -> replicas, fed by KV events (confirmed) and by the
router's own routing decisions (pending: the blocks a replica will hold once it has run a request
just sent there, until its events say so, or the pending entry expires).

Pending entries are what keeps affinity while a tenant's first request is still in prefill: without
them every request of a new prefix that arrives before the first one's KV events is a "miss" and
spreads over the replicas."""
from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

from ridgeline.engine.prefix_cache import BlockHash

PENDING_TTL_S = 30.0


class KVIndex:
    def __init__(self, pending_ttl: float = PENDING_TTL_S, clock=time.monotonic):
        self.held: dict[str, set[BlockHash]] = {}  # replica -> hashes its events say it holds
        self.owners: dict[BlockHash, set[str]] = {}  # the inverse of held
        self.pending: dict[str, dict[BlockHash, float]] = {}  # replica -> hash -> expiry
        self.ttl = pending_ttl
        self.clock = clock

    # ---- events (confirmed) ------------------------------------------------------------------
    def stored(self, replica: str, hashes: Iterable[BlockHash]) -> None:
        held = self.held.setdefault(replica, set())
        pending = self.pending.get(replica, {})
        for h in hashes:
            held.add(h)
            self.owners.setdefault(h, set()).add(replica)
            pending.pop(h, None)

    def removed(self, replica: str, hashes: Iterable[BlockHash]) -> None:
        held = self.held.get(replica, set())
        pending = self.pending.get(replica, {})
        for h in hashes:
            held.discard(h)
            pending.pop(h, None)
            owners = self.owners.get(h)
            if owners is not None:
                owners.discard(replica)
                if not owners:
                    del self.owners[h]

    def reset(self, replica: str, hashes: Iterable[BlockHash] = ()) -> None:
        """Replace what replica holds (a snapshot after a gap; empty when it goes down)."""
        self.removed(replica, list(self.held.get(replica, ())))
        self.pending.pop(replica, None)
        self.stored(replica, hashes)

    def apply(self, replica: str, events: Sequence[tuple[str, Sequence[BlockHash]]]) -> None:
        for kind, hashes in events:
            (self.stored if kind == "stored" else self.removed)(replica, hashes)

    # ---- routing -----------------------------------------------------------------------------
    def expect(self, replica: str, hashes: Sequence[BlockHash]) -> None:
        """replica was sent a request with these blocks: count them as held there for a while."""
        now = self.clock()
        expiry = now + self.ttl
        pending = self.pending.setdefault(replica, {})
        if len(pending) > 4 * len(hashes) + 4096:  # drop the expired now and then: bounded memory
            for h in [h for h, t in pending.items() if t <= now]:
                del pending[h]
        held = self.held.get(replica, ())
        for h in hashes:
            if h not in held:
                pending[h] = expiry

    def matched_blocks(self, hashes: Sequence[BlockHash], replicas: Iterable[str]) -> dict[str, int]:
        """For each replica, how many of the first blocks (hashes in chain order) it holds."""
        now = self.clock()
        out = {}
        for r in replicas:
            held, pending = self.held.get(r, ()), self.pending.get(r, {})
            n = 0
            for h in hashes:
                if h in held or pending.get(h, 0.0) > now:
                    n += 1
                else:
                    break
            out[r] = n
        return out
