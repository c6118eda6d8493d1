"""One replica as the router sees it: its URL, whether it is up, and the work it has been sent.

Load is counted in tokens, not requests: `waiting_tokens` are prompt tokens routed here whose request
has no first token yet, less the prefix the router expected the replica to have cached (the prefill
work still queued there); each running request adds DECODE_TOKENS (a decode step's share)."""
from __future__ import annotations

from dataclasses import dataclass, field

DECODE_TOKENS = 16  # what one running (decoding) request weighs against queued prompt tokens


@dataclass
class Replica:
    url: str
    info: dict = field(default_factory=dict)  # the replica's GET /info
    up: bool = True
    reason: str = ""  # why it is down
    waiting_tokens: int = 0
    running: int = 0
    in_flight: int = 0
    routed: int = 0  # requests sent here, ever

    @property
    def name(self) -> str:
        return self.url

    @property
    def load(self) -> int:
        return self.waiting_tokens + DECODE_TOKENS * self.running

    def mark_down(self, reason: str) -> bool:
        """True if it was up (the caller then forgets its cached blocks)."""
        was_up, self.up, self.reason = self.up, False, reason
        return was_up

    def mark_up(self) -> None:
        self.up, self.reason = True, ""


class Ticket:
    """One routed request's share of a replica's load, from routing until it ends (`on_end` then
    runs once: the router releases what it assumed the request would leave in the replica's cache)."""

    def __init__(self, replica: Replica, prefill_tokens: int, expected_hit: int = 0, on_end=None):
        self.replica = replica
        self.prefill = prefill_tokens
        self.expected_hit = expected_hit  # prompt tokens the router expects the replica to have cached
        self._on_end = on_end
        self.started = False
        self.ended = False
        replica.waiting_tokens += prefill_tokens
        replica.in_flight += 1
        replica.routed += 1

    def first_token(self) -> None:
        if self.started or self.ended:
            return
        self.started = True
        self.replica.waiting_tokens -= self.prefill
        self.replica.running += 1

    def end(self) -> None:
        if self.ended:
            return
        self.ended = True
        if self.started:
            self.replica.running -= 1
        else:
            self.replica.waiting_tokens -= self.prefill
        self.replica.in_flight -= 1
        if self._on_end is not None:
            self._on_end()
