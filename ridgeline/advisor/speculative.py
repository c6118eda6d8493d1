"""Speculative decoding arithmetic: expected tokens per verification pass and the gain by batch size.

A draft proposes k tokens, each accepted with probability alpha (independently); the target verifies all
k + 1 positions in one forward and always contributes one token, so a pass yields
E = 1 + alpha + ... + alpha^k = (1 - alpha^(k+1)) / (1 - alpha) tokens. A pass costs k draft steps (c x a
target step each) plus one verification over k + 1 tokens per sequence. Below the ridge that forward
costs about one decode step (gain ~ E / (1 + c k)); past the ridge it costs ~(k + 1) steps and the gain
collapses below 1.
"""
from __future__ import annotations

import math

from ridgeline.advisor.errors import AdvisorError
from ridgeline.advisor.roofline import Platform, decode_step, verify_step


def expected_tokens(alpha: float, k: int) -> float:
    if not 0 <= alpha < 1:
        raise AdvisorError(f"acceptance rate alpha must be in [0, 1), got {alpha}", "alpha")
    if k < 1:
        raise AdvisorError(f"draft length k must be >= 1, got {k}", "k")
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def batch1_gain(alpha: float, k: int, c: float) -> float:
    """The bandwidth-bound limit: verification costs one step."""
    return expected_tokens(alpha, k) / (1 + c * k)


def gain(pl: Platform, batch: float, context: float, alpha: float, k: int, c: float) -> float:
    if not 0 <= c < math.inf:
        raise AdvisorError(f"draft cost ratio c must be finite and >= 0, got {c}", "draft_cost")
    base = decode_step(pl, batch, context).total
    verify = verify_step(pl, batch, context, k).total
    return expected_tokens(alpha, k) * base / (verify + c * k * base)


def break_even_batch(pl: Platform, context: float, alpha: float, k: int, c: float,
                     limit: int = 1 << 14) -> float | None:
    """Largest batch at which speculation still pays (gain >= 1); None if it never does."""
    if gain(pl, 1, context, alpha, k, c) < 1:
        return None
    if gain(pl, limit, context, alpha, k, c) >= 1:
        return float(limit)
    lo, hi = 1, limit
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if gain(pl, mid, context, alpha, k, c) >= 1 else (lo, mid)
    return float(lo)


def best_k(pl: Platform, batch: float, context: float, alpha: float, c: float, k_max: int = 8) -> tuple[int, float]:
    return max(((k, gain(pl, batch, context, alpha, k, c)) for k in range(1, k_max + 1)), key=lambda kg: kg[1])
