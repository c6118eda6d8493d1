"""A decode worker's inbox: the transfers it expects, and the payloads that arrived for them, by
transfer id, until the request they belong to takes them. Thread-safe (the connector's receiving
threads reserve and put, the server's routes take).

A transfer exists only once this worker issued its id (`expect`, asked by the front before the
prefill starts); a payload for any other id is refused before its bytes are read. Each id is
received once. What is bounded:
- ids outstanding (`max_expected`): an `expect` over it is refused (that request is computed here);
- bytes (`budget`): a transfer's bytes are reserved before they are allocated and given back when
  its payload is released (copied into the pool, or dropped), so received KV waiting here or in the
  engine's adoption queue never exceeds the budget;
- time: an id nobody takes within `ttl` seconds of its issue is dropped with its payload, and one
  whose request stopped waiting (`take` timed out, `abandon`) is dropped at once."""
from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

from ridgeline.disagg.payload import KVPayload
from ridgeline.disagg.wire import Refused, new_transfer_id

DEFAULT_INBOX_BYTES = 4 << 30  # received KV held at once (waiting for its request, or for pool room)
DEFAULT_MAX_EXPECTED = 4096  # transfer ids issued and not yet taken or dropped
DEFAULT_TTL = 900.0  # seconds an issued id lives (longer than a front waits for a prefill)


@dataclass
class _Slot:
    deadline: float
    receiving: bool = False  # bytes reserved, arriving
    payload: KVPayload | None = None


class Inbox:
    def __init__(self, ttl: float = DEFAULT_TTL, budget: int = DEFAULT_INBOX_BYTES,
                 max_expected: int = DEFAULT_MAX_EXPECTED):
        self.ttl, self.budget, self.max_expected = ttl, budget, max_expected
        self._cond = threading.Condition()
        self._slots: OrderedDict[str, _Slot] = OrderedDict()  # in issue order: deadlines ascend
        self.bytes = 0  # reserved by transfers not yet released
        self.received = 0
        self.expired = 0

    def __len__(self) -> int:
        """Payloads held, waiting for their request."""
        with self._cond:
            return sum(s.payload is not None for s in self._slots.values())

    @property
    def outstanding(self) -> int:
        with self._cond:
            return len(self._slots)

    def expect(self) -> str:
        """A new transfer id this worker will accept one payload for; Refused when too many are out."""
        with self._cond:
            self._expire(time.monotonic())
            if len(self._slots) >= self.max_expected:
                raise Refused(f"{self.max_expected} transfers already outstanding")
            tid = new_transfer_id()
            self._slots[tid] = _Slot(time.monotonic() + self.ttl)
            return tid

    def reserve(self, transfer_id: str, nbytes: int) -> Callable[[], None]:
        """Room for transfer_id's nbytes, before they are allocated; returns what gives them back
        (idempotent). Refused for an id not issued here (or taken, dropped, already arriving) or over
        the budget."""
        with self._cond:
            self._expire(time.monotonic())
            slot = self._slots.get(transfer_id)
            if slot is None:
                raise Refused(f"transfer {transfer_id} was not issued by this worker, or is no longer awaited")
            if slot.receiving or slot.payload is not None:
                raise Refused(f"transfer {transfer_id} was already received")
            if self.bytes + nbytes > self.budget:
                raise Refused(f"{nbytes} bytes of KV would take the inbox over its budget ({self.bytes} of "
                              f"{self.budget} bytes held)")
            slot.receiving = True
            self.bytes += nbytes
        done = threading.Event()

        def give_back() -> None:
            with self._cond:
                if not done.is_set():
                    done.set()
                    self.bytes -= nbytes
        return give_back

    def put(self, payload: KVPayload) -> bool:
        """File a payload whose bytes were reserved; False (payload released) if its request stopped
        waiting meanwhile."""
        with self._cond:
            slot = self._slots.get(payload.transfer_id)
            if slot is None or not slot.receiving or slot.payload is not None:
                payload.release()
                return False
            slot.payload = payload
            self.received += 1
            self._cond.notify_all()
        return True

    def fail(self, transfer_id: str) -> None:
        """Its bytes did not come whole: forget the id (its request computes the prompt, now)."""
        self.abandon(transfer_id)

    def take(self, transfer_id: str, timeout: float) -> KVPayload | None:
        """The payload of transfer_id, waiting up to timeout seconds; None at once for an id not
        outstanding here, and None (the id dropped) if it has not come in time."""
        with self._cond:
            self._cond.wait_for(lambda: self._ready_or_gone(transfer_id), timeout)
            slot = self._slots.pop(transfer_id, None)
            if slot is None or slot.payload is None:
                self._cond.notify_all()
                return None
            return slot.payload

    async def take_async(self, transfer_id: str, timeout: float) -> KVPayload | None:
        return await asyncio.to_thread(self.take, transfer_id, timeout)

    def abandon(self, transfer_id: str) -> None:
        with self._cond:
            slot = self._slots.pop(transfer_id, None)
            if slot is not None and slot.payload is not None:
                slot.payload.release()
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            for slot in self._slots.values():
                if slot.payload is not None:
                    slot.payload.release()
            self._slots.clear()
            self._cond.notify_all()

    def _ready_or_gone(self, transfer_id: str) -> bool:
        slot = self._slots.get(transfer_id)
        return slot is None or slot.payload is not None

    def _expire(self, now: float) -> None:
        while self._slots:
            tid, slot = next(iter(self._slots.items()))
            if slot.deadline > now:
                return
            del self._slots[tid]
            if slot.payload is not None:
                slot.payload.release()
            self.expired += 1
            self._cond.notify_all()
