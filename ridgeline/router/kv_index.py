"""Which replica holds which prefix block: hash -> replicas, fed by KV events (confirmed) and by the
router's own routing decisions (pending: the blocks a replica will hold once it has run a request
just sent there).

A pending entry lasts while any request that put it there is in flight (however long it queues
on a loaded replica), then a grace period for the replica's events to catch up. Without it, every
request of a prefix that arrives before the first one's KV events is a "miss" and spreads over the
replicas; with a fixed lifetime instead, the same happens to every request that arrives after a
queued first request has waited longer than that lifetime, which under load is most of them.
Events never cancel an in-flight entry: a `removed` only says an older copy left the pool, and the
request in flight will store the blocks again."""
from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ridgeline.engine.prefix_cache import BlockHash

GRACE_S = 10.0  # after its last request ends, a pending entry waits this long for the events


@dataclass
class _Pending:
    in_flight: int = 0  # requests sent with this block and not ended
    until: float = 0.0  # with none in flight: counted as held until then

    def live(self, now: float) -> bool:
        return self.in_flight > 0 or self.until > now


class KVIndex:
    def __init__(self, grace: float = GRACE_S, clock=time.monotonic):
        self.held: dict[str, set[BlockHash]] = {}  # replica -> hashes its events say it holds
        self.owners: dict[BlockHash, set[str]] = {}  # the inverse of held
        self.pending: dict[str, dict[BlockHash, _Pending]] = {}  # replica -> hash -> routed requests' claim
        self.grace = grace
        self.clock = clock

    # ---- events (confirmed) ------------------------------------------------------------------
    def stored(self, replica: str, hashes: Iterable[BlockHash]) -> None:
        held = self.held.setdefault(replica, set())
        pending = self.pending.get(replica, {})
        for h in hashes:
            held.add(h)
            self.owners.setdefault(h, set()).add(replica)
            entry = pending.get(h)
            if entry is not None and entry.in_flight == 0:
                del pending[h]

    def removed(self, replica: str, hashes: Iterable[BlockHash]) -> None:
        held = self.held.get(replica, set())
        pending = self.pending.get(replica, {})
        for h in hashes:
            held.discard(h)
            entry = pending.get(h)
            if entry is not None and entry.in_flight == 0:
                del pending[h]
            owners = self.owners.get(h)
            if owners is not None:
                owners.discard(replica)
                if not owners:
                    del self.owners[h]

    def reset(self, replica: str, hashes: Iterable[BlockHash] = ()) -> None:
        """Replace what replica holds (a snapshot after a gap; empty when it goes down). Entries of
        requests still in flight stay: they end (and settle) on their own."""
        self.removed(replica, list(self.held.get(replica, ())))
        pending = self.pending.get(replica, {})
        for h in [h for h, e in pending.items() if e.in_flight == 0]:
            del pending[h]
        self.stored(replica, hashes)

    def apply(self, replica: str, events: Sequence[tuple[str, Sequence[BlockHash]]]) -> None:
        for kind, hashes in events:
            (self.stored if kind == "stored" else self.removed)(replica, hashes)

    # ---- routing -----------------------------------------------------------------------------
    def expect(self, replica: str, hashes: Sequence[BlockHash]) -> None:
        """A request with these blocks was sent to replica: count them as held there until `settle`
        (its end) plus the grace period, or until events confirm them."""
        pending = self.pending.setdefault(replica, {})
        if len(pending) > 4 * len(hashes) + 4096:  # drop the settled and expired now and then: bounded memory
            now = self.clock()
            for h in [h for h, e in pending.items() if not e.live(now)]:
                del pending[h]
        for h in hashes:
            entry = pending.get(h)
            if entry is None:
                entry = pending[h] = _Pending()
            entry.in_flight += 1

    def settle(self, replica: str, hashes: Sequence[BlockHash]) -> None:
        """The request `expect` announced has ended (answered, failed or cancelled)."""
        pending = self.pending.get(replica, {})
        held = self.held.get(replica, ())
        until = self.clock() + self.grace
        for h in hashes:
            entry = pending.get(h)
            if entry is None or entry.in_flight == 0:
                continue
            entry.in_flight -= 1
            if entry.in_flight == 0:
                if h in held:
                    del pending[h]
                else:
                    entry.until = until

    def footprint(self, replica: str) -> int:
        """About how many blocks replica holds or will hold (confirmed, plus pending not yet swept)."""
        return len(self.held.get(replica, ())) + len(self.pending.get(replica, ()))

    def matched_blocks(self, hashes: Sequence[BlockHash], replicas: Iterable[str]) -> dict[str, int]:
        """For each replica, how many of the first blocks (hashes in chain order) it holds."""
        now = self.clock()
        out = {}
        for r in replicas:
            held, pending = self.held.get(r, ()), self.pending.get(r, {})
            n = 0
            for h in hashes:
                entry = pending.get(h)
                if h in held or (entry is not None and entry.live(now)):
                    n += 1
                else:
                    break
            out[r] = n
        return out
