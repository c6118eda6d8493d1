"""A decode worker's inbox: payloads that arrived, by transfer id, until the request they belong to
takes them. Thread-safe (the connector's receiving threads put, the server's routes take).

Nothing stays forever: a payload nobody takes within `ttl` seconds is released at the next put, and
a transfer whose request gave up waiting (`take` timed out, or `abandon`) is released on arrival."""
from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict

from ridgeline.disagg.payload import KVPayload

_ABANDONED_KEPT = 4096  # transfer ids remembered as given up (bounded)


class Inbox:
    def __init__(self, ttl: float = 120.0):
        self.ttl = ttl
        self._cond = threading.Condition()
        self._items: dict[str, tuple[KVPayload, float]] = {}
        self._abandoned: OrderedDict[str, None] = OrderedDict()
        self.received = 0
        self.expired = 0

    def __len__(self) -> int:
        with self._cond:
            return len(self._items)

    def put(self, payload: KVPayload) -> bool:
        """False (payload released) if its request stopped waiting for it."""
        now = time.monotonic()
        with self._cond:
            self._expire(now)
            tid = payload.transfer_id
            if tid in self._abandoned:
                payload.release()
                return False
            old = self._items.pop(tid, None)
            if old is not None:
                old[0].release()
            self._items[tid] = (payload, now)
            self.received += 1
            self._cond.notify_all()
        return True

    def take(self, transfer_id: str, timeout: float) -> KVPayload | None:
        """The payload of transfer_id, waiting up to timeout seconds; None (and abandoned) if it has not come."""
        with self._cond:
            self._cond.wait_for(lambda: transfer_id in self._items, timeout)
            item = self._items.pop(transfer_id, None)
            if item is None:
                self._abandon(transfer_id)
                return None
            return item[0]

    async def take_async(self, transfer_id: str, timeout: float) -> KVPayload | None:
        return await asyncio.to_thread(self.take, transfer_id, timeout)

    def abandon(self, transfer_id: str) -> None:
        with self._cond:
            self._abandon(transfer_id)

    def close(self) -> None:
        with self._cond:
            for payload, _ in self._items.values():
                payload.release()
            self._items.clear()

    def _abandon(self, transfer_id: str) -> None:
        item = self._items.pop(transfer_id, None)
        if item is not None:
            item[0].release()
        self._abandoned[transfer_id] = None
        while len(self._abandoned) > _ABANDONED_KEPT:
            self._abandoned.popitem(last=False)

    def _expire(self, now: float) -> None:
        for tid in [t for t, (_, at) in self._items.items() if now - at > self.ttl]:
            self._items.pop(tid)[0].release()
            self.expired += 1
