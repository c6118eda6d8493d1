"""KV eviction (lossy, opt-in): each request keeps at most `budget` tokens of KV. Torch-free.

Before a step that adds n tokens to a request whose kept tokens plus n exceed the budget, the policy
picks tokens to evict; the survivors stay in the request's slots, which need not follow position
order: K is cached after rotary at the token's original position, so a query still sees every kept
key at its true distance (attention over a set of keys does not depend on their order). Rotating at
original positions rather than at positions within the cache (as StreamingLLM does to run past the
trained context) keeps the model exactly as trained inside its context, costs nothing at attention
time, and makes a budget >= the sequence identical to no eviction.

Slots stay dense: the kept tokens occupy slots [0, kept) and a step's new tokens the slots after them
(so a prefill chunk stays causal: row i attends to slots [0, kept + i]). Evicting is therefore
moving the kept tokens of the tail into the holes the evicted ones leave, at most one move per
evicted token (`moves`: pairs of slot indices, applied by the runner before the step's forward).

Policies (`victims`): both always keep the first `sinks` positions (attention sinks).
- streaming (StreamingLLM): the most recent tokens; evicts the oldest others.
- h2o (heavy hitters): the most recent half of what is left after the sinks, and of the rest those
  with the most attention received, summed over layers, heads and every query since they entered
  (`observe`); the cache is shared by all layers, so one set of tokens serves them all.

A step's new tokens are capped (`cap`) so that a query sees at least 7/8 of the non-sink budget of
earlier context once eviction has started. The engine turns prefix caching and n > 1 block sharing
off with eviction: moves rewrite a request's blocks in place, so no block of it may be cached or shared.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

POLICIES = ("streaming", "h2o")


def streaming_victims(pos: np.ndarray, score: np.ndarray, e: int, sinks: int, budget: int) -> np.ndarray:
    """Slots of the e oldest tokens after the sinks."""
    cand = np.flatnonzero(pos >= sinks)
    return cand[np.argsort(pos[cand], kind="stable")[:e]]


def h2o_victims(pos: np.ndarray, score: np.ndarray, e: int, sinks: int, budget: int) -> np.ndarray:
    """Slots of the e tokens with the least accumulated attention (the older on ties), among those that
    are neither sinks nor among the (budget - sinks) // 2 most recent."""
    cand = np.flatnonzero(pos >= sinks)
    recent = min((budget - sinks) // 2, len(cand) - e)
    by_age = cand[np.argsort(pos[cand], kind="stable")]
    old = by_age[:len(by_age) - recent] if recent > 0 else by_age
    return old[np.lexsort((pos[old], score[old]))[:e]]


VICTIMS = {"streaming": streaming_victims, "h2o": h2o_victims}


@dataclass
class Kept:
    """One request's kept tokens in slot order: their positions and (h2o) accumulated attention."""
    pos: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    score: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float64))


class Evictor:
    def __init__(self, policy: str, budget: int, sinks: int):
        if policy not in VICTIMS:
            raise ValueError(f"unknown KV eviction policy {policy!r}; known: {', '.join(POLICIES)}")
        self.policy, self.budget, self.sinks = policy, budget, sinks
        self.victims = VICTIMS[policy]
        self.max_new = max(1, (budget - sinks) // 8)
        self.kept: dict[str, Kept] = {}
        self.evicted = 0  # tokens evicted over the engine's life

    @property
    def wants_scores(self) -> bool:
        return self.policy == "h2o"

    def held(self, req_id: str) -> int:
        k = self.kept.get(req_id)
        return 0 if k is None else len(k.pos)

    def cap(self, req_id: str, n: int) -> int:
        """Tokens a step may add: all n while they fit the budget without evicting, else max_new."""
        room = self.budget - self.held(req_id)
        return n if n <= room else max(1, min(n, max(room, self.max_new)))

    def prepare(self, req_id: str, start: int, n: int) -> tuple[int, list[tuple[int, int]]]:
        """Before a step that computes positions start..start+n-1 (n <= cap): evict so the kept tokens
        plus n fit the budget. Returns (slots kept before the new tokens, moves (from slot, to slot))."""
        k = self.kept.setdefault(req_id, Kept())
        L = len(k.pos)
        assert L == 0 and start == 0 or L and int(k.pos.max()) == start - 1, "eviction state out of step"
        e = max(0, L + n - self.budget)
        moves: list[tuple[int, int]] = []
        if e:
            victims = self.victims(k.pos, k.score, e, self.sinks, self.budget)
            gone = np.zeros(L, bool)
            gone[victims] = True
            keep = L - e
            holes = np.flatnonzero(gone[:keep])
            tail = keep + np.flatnonzero(~gone[keep:])
            k.pos[holes], k.score[holes] = k.pos[tail], k.score[tail]
            k.pos, k.score = k.pos[:keep], k.score[:keep]
            moves = list(zip(tail.tolist(), holes.tolist()))
            self.evicted += e
        held = len(k.pos)
        k.pos = np.concatenate([k.pos, np.arange(start, start + n, dtype=np.int64)])
        k.score = np.concatenate([k.score, np.zeros(n)])
        return held, moves

    def observe(self, req_id: str, attention: np.ndarray) -> None:
        """Attention each of the request's slots received in the last step (h2o)."""
        k = self.kept.get(req_id)
        if k is not None:
            k.score[:len(attention)] += attention[:len(k.score)]

    def forget(self, req_id: str) -> None:
        self.kept.pop(req_id, None)


def conflict(policy: str, speculative_method: str | None, sliding_window: int | None,
             attention_backend: str) -> str | None:
    """Why KV eviction cannot run with these settings, or None."""
    if speculative_method is not None:
        return "KV eviction cannot be combined with speculative decoding (rejected proposals would leave " \
               "evicted slots behind)"
    if sliding_window is not None:
        return "KV eviction cannot be combined with a sliding-window model (its window counts positions, the " \
               "cache under eviction holds kept tokens); the window already bounds its memory"
    if policy == "h2o" and attention_backend not in ("auto", "h2o"):
        return f"KV eviction h2o runs its own attention backend (h2o), not {attention_backend}"
    return None


def peak_tokens(num_tokens: int, window: int | None, chunk: int, block_size: int, budget: int | None) -> int:
    """KV slots a request of num_tokens holds at most: all of them; with a window (every layer's) the
    window behind a step's first token, that step's tokens (a prefill chunk) and a partial block; with
    KV eviction, its budget in whole blocks."""
    if budget is not None:
        return min(num_tokens, -(-budget // block_size) * block_size)
    return num_tokens if window is None else min(num_tokens, window - 1 + chunk + block_size)


def describe_eviction(cc) -> str:
    """The start-up line of an engine that evicts (cc: its CacheConfig)."""
    return (f"{cc.kv_eviction} (lossy): at most {cc.kv_eviction_budget} tokens of KV per request, the first "
            f"{cc.kv_sink_tokens} always kept")
