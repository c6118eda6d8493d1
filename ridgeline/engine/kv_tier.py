"""The second KV tier's bookkeeping: which slot of the offload store holds what. Torch-free; the
KV manager decides, the runner copies (`ridgeline/runner/kv_store.py`).

A slot is in exactly one state (check):
- free:     in free_slots.
- cached:   holds a prefix-cache block, keyed by its stable block hash (and its whole key, compared
            on a hit as the pool's index does); in `lru`, least recently used first. Evicted to
            make room. A hit is loaded back into a pool block and stays here (blocks are immutable
            content, so the tier is inclusive: a block evicted again needs no second store).
- swapped:  holds a block of a preempted request (`swapped[req_id]`); never evicted; released once
            the request's blocks are loaded back (or it is dropped).

Copies are recorded here and handed to the runner with the step's plan (`drain`), which runs every
store before any load and both before the forward. So within one step:
- a store reads a pool block before any load or forward overwrites it;
- a slot read by a load of this step is `pinned`: no store of this step may reuse it;
- a block loaded this step is not stored again this step (it holds nothing yet).
"""
from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass

from ridgeline.step_plan import TierCopies

Key = tuple  # the prefix cache's BlockKey: (parent hash | None, tokens, extra keys | None)


@dataclass
class TierStats:
    """Monotonic counters, for Prometheus and reports (blocks; bytes = blocks * block_bytes)."""
    hits: int = 0  # prompt tokens served from the tier (prefix-cache hits found here, not in the pool)
    stores: int = 0  # blocks written to the tier (evicted prefix blocks and swapped-out blocks)
    loads: int = 0  # blocks read back into the pool
    evictions: int = 0  # cached tier blocks dropped to make room
    dropped: int = 0  # blocks the tier had no room for (recomputed if needed again)
    swaps_out: int = 0  # preempted requests whose blocks went to the tier
    swaps_in: int = 0  # ... and came back
    swap_fallbacks: int = 0  # preemptions that wanted a swap and recomputed (tier full)


@dataclass
class Swapped:
    slots: list[int]  # the request's first len(slots) blocks, in table order
    num_tokens: int  # computed tokens they hold


class TierIndex:
    def __init__(self, name: str, num_slots: int, block_bytes: int, costs: SwapCosts | None = None):
        if num_slots < 1:
            raise ValueError(f"the {name} KV tier holds no block ({block_bytes} B each)")
        self.name = name
        self.num_slots = num_slots
        self.block_bytes = block_bytes
        self.free_slots: deque[int] = deque(range(num_slots))
        self.lru: OrderedDict[bytes, tuple[int, Key]] = OrderedDict()  # hash -> (slot, key), LRU first
        self.slot_hash: dict[int, bytes] = {}
        self.swapped: dict[str, Swapped] = {}
        self.pinned: set[int] = set()
        self.loading: set[int] = set()  # pool blocks loaded this step
        self.releasing: list[int] = []  # swap slots read this step: free once the step's copies ran
        self.copies = TierCopies()
        self.stats = TierStats()
        self.costs = costs or SwapCosts()
        self.full_warned = False  # the engine warns once when the tier had no room

    # ---- prefix blocks -------------------------------------------------------------------------
    def lookup(self, h: bytes, key: Key) -> int | None:
        entry = self.lru.get(h)
        return entry[0] if entry is not None and entry[1] == key else None

    def offer(self, block: int, h: bytes, key: Key) -> None:
        """A cached pool block is being evicted: keep its content here (a no-op if already here)."""
        if h in self.lru:
            self.lru.move_to_end(h)
            return
        if block in self.loading:
            return
        slot = self._take_slot()
        if slot is None:
            self.stats.dropped += 1
            return
        self.lru[h] = (slot, key)
        self.slot_hash[slot] = h
        self._store(block, slot)

    def load_hits(self, slots: Sequence[int], blocks: Sequence[int]) -> None:
        """Tier hits go back into these (new) pool blocks this step; they stay cached here too."""
        for slot, block in zip(slots, blocks):
            self.lru.move_to_end(self.slot_hash[slot])
            self._load(slot, block)

    def pin(self, slots: Sequence[int]) -> None:
        self.pinned.update(slots)

    def clear(self) -> int:
        """Forget every cached (not swapped, not pinned) block; returns how many."""
        gone = [h for h, (slot, _) in self.lru.items() if slot not in self.pinned]
        for h in gone:
            slot, _ = self.lru.pop(h)
            del self.slot_hash[slot]
            self.free_slots.append(slot)
        return len(gone)

    # ---- swapped requests ----------------------------------------------------------------------
    def swap_out(self, req_id: str, blocks: Sequence[int], num_tokens: int) -> bool:
        """Store a preempted request's blocks; False (nothing changed) if the tier lacks room."""
        if any(b in self.loading for b in blocks):
            return False
        room = len(self.free_slots) + sum(1 for s, _ in self.lru.values() if s not in self.pinned)
        if room < len(blocks):
            self.stats.swap_fallbacks += 1
            return False
        slots = [self._take_slot() for _ in blocks]
        for block, slot in zip(blocks, slots):
            self._store(block, slot)
        self.swapped[req_id] = Swapped(slots, num_tokens)
        self.stats.swaps_out += 1
        return True

    def swap_in(self, req_id: str, blocks: Sequence[int]) -> None:
        """Load a swapped request's blocks into these pool blocks (its table's first ones)."""
        entry = self.swapped.pop(req_id)
        for slot, block in zip(entry.slots, blocks):
            self._load(slot, block)
        self.releasing.extend(entry.slots)
        self.stats.swaps_in += 1

    def forget(self, req_id: str) -> None:
        """A swapped request left (aborted) or will recompute: release its slots."""
        entry = self.swapped.pop(req_id, None)
        if entry is not None:
            self.releasing.extend(entry.slots)

    # ---- the step boundary ---------------------------------------------------------------------
    def drain(self) -> TierCopies | None:
        """This step's copies for the plan; afterwards nothing is pinned."""
        copies, self.copies = self.copies, TierCopies()
        self.pinned.clear()
        self.loading.clear()
        self.free_slots.extend(self.releasing)
        self.releasing = []
        return copies or None

    def _store(self, block: int, slot: int) -> None:
        self.copies.stores.append((block, slot))
        self.stats.stores += 1

    def _load(self, slot: int, block: int) -> None:
        self.pinned.add(slot)
        self.loading.add(block)
        self.copies.loads.append((slot, block))
        self.stats.loads += 1

    def _take_slot(self) -> int | None:
        if self.free_slots:
            return self.free_slots.popleft()
        for h, (slot, _) in self.lru.items():  # least recently used first
            if slot not in self.pinned:
                del self.lru[h]
                del self.slot_hash[slot]
                self.stats.evictions += 1
                return slot
        return None

    def check(self) -> None:
        cached = {s for s, _ in self.lru.values()}
        swapped = [s for e in self.swapped.values() for s in e.slots]
        free = list(self.free_slots) + self.releasing
        every = list(cached) + swapped + free
        assert len(every) == len(set(every)) == self.num_slots, \
            f"tier slots: cached {len(cached)} + swapped {len(swapped)} + free {len(free)} != {self.num_slots}"
        assert all(self.lru[h][0] == s for s, h in self.slot_hash.items()) and len(self.slot_hash) == len(self.lru), \
            "tier hash map and slots disagree"


PREEMPTION_MODES = ("auto", "swap", "recompute")


class SwapCosts:
    """Swap or recompute a preempted request, by their estimated time: swapping moves its KV bytes
    out and back (2 x bytes / the tier's copy rate), recomputing prefills its computed tokens again
    (tokens / the prefill rate). Both rates are measured online (exponential moving averages of the
    steps' copies and prefill chunks), starting from defaults until the first measurements."""

    def __init__(self, mode: str = "auto", bytes_per_s: float = 2e9, prefill_tokens_per_s: float = 2000.0,
                 alpha: float = 0.2):
        if mode not in PREEMPTION_MODES:
            raise ValueError(f"preemption_mode must be one of {', '.join(PREEMPTION_MODES)}, got {mode!r}")
        self.mode = mode
        self.bytes_per_s = bytes_per_s
        self.prefill_tokens_per_s = prefill_tokens_per_s
        self.alpha = alpha

    def observe_copy(self, nbytes: int, seconds: float) -> None:
        if nbytes > 0 and seconds > 0:
            self.bytes_per_s += self.alpha * (nbytes / seconds - self.bytes_per_s)

    def observe_prefill(self, tokens: int, seconds: float) -> None:
        if tokens > 0 and seconds > 0:
            self.prefill_tokens_per_s += self.alpha * (tokens / seconds - self.prefill_tokens_per_s)

    def swap_seconds(self, nbytes: int) -> float:
        return 2 * nbytes / self.bytes_per_s

    def recompute_seconds(self, num_tokens: int) -> float:
        return num_tokens / self.prefill_tokens_per_s

    def prefer_swap(self, num_tokens: int, nbytes: int) -> bool:
        if self.mode != "auto":
            return self.mode == "swap"
        return self.swap_seconds(nbytes) < self.recompute_seconds(num_tokens)


def store_now(kv, store) -> None:
    """Run the tier's stores queued so far (cached blocks an allocation just evicted) before anything
    writes into the pool outside a step's forward: the blocks they copy may already belong to the
    allocation that evicted them (an adopted request's KV, a layer-skip draft's lookahead writes), and
    the step would store them only after those writes. Loads stay queued for the step. KVStoreError
    (runner/kv_store.py) if a copy fails."""
    tier = kv.tier
    if tier is None or store is None or not tier.copies.stores:
        return
    stores, tier.copies.stores = tier.copies.stores, []
    store.run(TierCopies(stores=stores))
