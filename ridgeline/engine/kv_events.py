"""KV events: what entered and left a replica's prefix cache, by stable block hash. Torch-free.

The prefix-cache index calls `stored` when a full block enters it and `removed` when it leaves
(evicted to hold other tokens, or a reset). The recorder only appends: the step thread hands the
batch to a publisher once per step (`drain`), so the hot path pays one list append per block.

Applying the events of every batch, in order, to an empty set gives exactly the hashes the pool's
prefix cache holds (tests/test_kv_events.py). Blocks kept only in the second KV tier are not
announced: a router scores what the pool serves.
"""
from __future__ import annotations

from ridgeline.engine.prefix_cache import BlockHash

STORED = "stored"
REMOVED = "removed"


class KVEventRecorder:
    def __init__(self):
        self._events: list[tuple[str, BlockHash]] = []

    def stored(self, h: BlockHash) -> None:
        self._events.append((STORED, h))

    def removed(self, h: BlockHash) -> None:
        self._events.append((REMOVED, h))

    def drain(self) -> list[tuple[str, list[BlockHash]]]:
        """The events since the last drain, consecutive ones of a kind grouped: [(kind, [hash, ...])]."""
        events, self._events = self._events, []
        grouped: list[tuple[str, list[BlockHash]]] = []
        for kind, h in events:
            if grouped and grouped[-1][0] == kind:
                grouped[-1][1].append(h)
            else:
                grouped.append((kind, [h]))
        return grouped


def apply_events(held: set[BlockHash], events: list[tuple[str, list[BlockHash]]]) -> None:
    """Fold one batch into a set of held hashes (publisher's mirror and subscriber's index alike)."""
    for kind, hashes in events:
        if kind == STORED:
            held.update(hashes)
        else:
            held.difference_update(hashes)
