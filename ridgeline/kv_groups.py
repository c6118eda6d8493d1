"""KV groups: which layers share a block table. Torch-free (the KV manager, the scheduler and the runner
read it).

A model whose layers mix sliding-window (local) and full (global) attention keeps one block table per KV
group instead of one per request: a local group's blocks behind its window are released as the request
moves on, a global group keeps all of them. Every group holds the same number of layers (`size`), so one
page of the shared pool holds one block of any group's layers: layer l's KV lives in storage region
`slot[l]` of the pages in group `group[l]`'s table. Global layers fill the first groups (group 0 among
them), then the local layers of each window, in layer order, size at a time (a last group padded with
unused regions).

At T tokens a request holds ceil(T / block) pages in group 0 and about min(T, window) / block in each local
group: for Gemma 3 (5 local layers to 1 global, window 512 or 1024) that is 1/6 + 5/6 x window / T of the
bytes one table for every layer holds, plus the padding of the last local group.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KVGroups:
    windows: tuple[int | None, ...]  # per group: its window (None: every key; the first groups, group 0 too)
    group: tuple[int, ...]  # per layer: its group
    slot: tuple[int, ...]  # per layer: its storage region within a page, 0..size-1
    size: int  # layers per page

    @property
    def num_groups(self) -> int:
        return len(self.windows)

    @property
    def num_local(self) -> int:
        return sum(w is not None for w in self.windows)

    def describe(self) -> str:
        local = sorted({w for w in self.windows if w is not None})
        return (f"{self.num_groups} KV groups of {self.size} layers: {self.num_groups - self.num_local} global, "
                f"{self.num_local} local (window {'/'.join(map(str, local))}), blocks behind a local window freed")

    def peak_pages(self, num_tokens: int, chunk: int, block_size: int) -> int:
        """Pages one request of num_tokens holds at most: every block of a global group; in a local group
        the window behind a step's first token, that step's tokens (a prefill chunk) and a partial block."""
        blocks = -(-num_tokens // block_size)
        return sum(blocks if w is None else min(blocks, -(-(w - 1 + chunk) // block_size) + 1) for w in self.windows)


def plan_groups(layer_windows: list[int | None]) -> KVGroups | None:
    """The KV groups of layers with these windows (None: a global layer), or None where one table serves
    them all as well: no local layer, or no global one (one window bounds the whole table then).

    The page size (layers per group) is the one with the fewest padded regions, the largest of those
    (one layer per page never pads): global layers fill groups in order, then each window's local layers."""
    n = len(layer_windows)
    kinds: dict[int | None, list[int]] = {}
    for i, w in enumerate(layer_windows):
        kinds.setdefault(w, []).append(i)
    if None not in kinds or len(kinds) == 1:
        return None
    order = [None, *sorted(w for w in kinds if w is not None)]  # the global groups first

    def regions(size: int) -> int:
        return size * sum(-(-len(kinds[w]) // size) for w in order)

    size = min(range(max(map(len, kinds.values())), 0, -1), key=regions)  # ties: the first, the largest
    windows: list[int | None] = []
    group, slot = [0] * n, [0] * n
    for w in order:
        for k, i in enumerate(kinds[w]):
            if k % size == 0:
                windows.append(w)
            group[i], slot[i] = len(windows) - 1, k % size
    return KVGroups(tuple(windows), tuple(group), tuple(slot), size)
