"""Serving estimates from the step model: TTFT, TPOT (alone and with prefills interleaved), throughput.

Continuous batching in steady state: while one request emits its O tokens, about C other requests
arrive (Little's law), and each of their prefills stalls the decode batch unless prefill is chunked
into the decode steps or moved to other devices (disaggregation).
"""
from __future__ import annotations

from dataclasses import dataclass

from ridgeline.advisor.roofline import Platform, decode_step, prefill
from ridgeline.advisor.workload import Workload


@dataclass(frozen=True)
class Serving:
    concurrency: float
    prefill_s: float  # one prompt, no prefix reuse
    step_s: float  # one decode step at this concurrency
    ttft: float
    tpot: float  # decode step alone
    tpot_contended: float  # plus the interleaved prefills of the other requests
    request_s: float  # TTFT + O * TPOT (contended)
    throughput: float  # output tokens/s over the deployment
    overloaded: bool = False


def estimate(pl: Platform, w: Workload, concurrency: float) -> Serving:
    c = max(concurrency, 1.0)
    pre = prefill(pl, w.prompt_len).total
    dstep = decode_step(pl, c, w.mean_decode_context).total
    ttft = pre + dstep  # waits for the step in flight, then runs its prefill
    contended = dstep + c * pre / w.output_len
    req = ttft + w.output_len * contended
    return Serving(c, pre, dstep, ttft, dstep, contended, req, c * w.output_len / req)


def at_rate(pl: Platform, w: Workload, rate: float, max_conc: float) -> Serving:
    """The concurrency a request rate settles at: smallest C with rate * T(C) <= C (Little's law).
    Overloaded when no C up to the KV capacity keeps up."""
    c_max = max(1, int(min(max_conc, 1 << 16)))
    fits = lambda c: rate * estimate(pl, w, c).request_s <= c  # noqa: E731
    prev, c = 0, 1
    while not fits(c):  # geometric scan: the feasible set need not extend to c_max
        if c >= c_max:
            return Serving(**{**estimate(pl, w, c_max).__dict__, "overloaded": True})
        prev, c = c, min(c_max, max(c + 1, int(c * 1.25)))
    lo, hi = prev + 1, c
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(mid) else (mid + 1, hi)
    return estimate(pl, w, lo)
