"""`advise disagg --simulate TRACE`: replay a request trace against co-located and xPyD deployments.

Costs per instance (each instance = the scenario's layout of devices on the chosen hardware):
- prefill of P tokens: the roofline's prefill time on that hardware;
- a decode step of B requests at context c: the roofline's decode step;
- a KV transfer of P tokens: this machine's measured fixed cost per transfer, plus P x the model's KV
  bytes per token over the hardware's link (over the measured per-token rate where it has none).
Scheduling, as the engine does without chunking: an instance runs a waiting prefill before its next
decode step (co-located: the decodes in flight wait for it); decode steps batch every running
request. Co-located instances take requests in turn; an xPyD front sends each prompt to the prefill
instance free first and its decode to the decode instance holding the fewest requests.
A request is good when TTFT <= the TTFT SLO and TPOT <= the TPOT SLO; a configuration meets the SLOs
when at least --slo-attainment of the requests are good."""
from __future__ import annotations

import heapq
import json
import math
from dataclasses import dataclass, field

from ridgeline.advisor.errors import AdvisorError


@dataclass(frozen=True)
class TraceRequest:
    arrival: float
    prompt: int
    output: int


def load_trace(path: str) -> list[TraceRequest]:
    out = []
    try:
        lines = open(path).read().splitlines()
    except OSError as e:
        raise AdvisorError(f"cannot read the trace {path}: {e.strerror}", "simulate") from None
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            r = TraceRequest(float(d["arrival"]), int(d["prompt_tokens"]), int(d["output_tokens"]))
        except (ValueError, KeyError, TypeError):
            raise AdvisorError(f"{path}:{i}: a trace line is a JSON object with arrival (s), prompt_tokens and "
                               "output_tokens", "simulate") from None
        if not (r.arrival >= 0 and math.isfinite(r.arrival) and r.prompt >= 1 and r.output >= 1):
            raise AdvisorError(f"{path}:{i}: need arrival >= 0, prompt_tokens >= 1, output_tokens >= 1", "simulate")
        out.append(r)
    if not out:
        raise AdvisorError(f"the trace {path} holds no request", "simulate")
    return sorted(out, key=lambda r: r.arrival)


@dataclass
class Costs:
    prefill: object  # (prompt tokens) -> s
    step: object  # (batch, mean context) -> s
    transfer: object  # (prompt tokens) -> s
    max_batch: int = 1 << 14  # requests a decode instance holds (KV room)


@dataclass
class _Live:
    req: TraceRequest
    ready: float  # when it may join a decode batch
    first: float  # when its first token reached the client
    left: int  # tokens still to decode
    done: float = math.nan


@dataclass
class Outcome:
    name: str
    devices: int
    ttft: list[float] = field(default_factory=list)
    tpot: list[float] = field(default_factory=list)

    def attainment(self, ttft_slo: float, tpot_slo: float) -> float:
        good = sum(1 for a, b in zip(self.ttft, self.tpot) if a <= ttft_slo and b <= tpot_slo)
        return good / len(self.ttft)


def _decode_instance(lives: list[_Live], costs: Costs, prefills=None) -> None:
    """One instance's decode steps over `lives` (sorted by ready). prefills: co-located, the prompts this
    instance computes itself before its decode steps (each stalls the batch)."""
    pending = sorted(lives, key=lambda x: x.ready)
    running: list[_Live] = []
    t, i = 0.0, 0
    while i < len(pending) or running:
        while i < len(pending) and pending[i].ready <= t and len(running) < costs.max_batch:
            live = pending[i]
            i += 1
            if prefills is not None:  # co-located: its prefill runs now, before the next step
                t += costs.prefill(live.req.prompt)
                live.first = t
            if live.left <= 0:
                live.done = live.first
            else:
                running.append(live)
        if not running:
            if i < len(pending):
                t = max(t, pending[i].ready)
            continue
        ctx = sum(x.req.prompt + x.req.output - x.left for x in running) / len(running)
        t += costs.step(len(running), ctx)
        for x in running:
            x.left -= 1
            if x.left == 0:
                x.done = t
        running = [x for x in running if x.left > 0]


def _outcome(name: str, devices: int, lives: list[_Live]) -> Outcome:
    o = Outcome(name, devices)
    for x in lives:
        o.ttft.append(x.first - x.req.arrival)
        o.tpot.append((x.done - x.first) / (x.req.output - 1) if x.req.output > 1 else 0.0)
    return o


def colocated(trace: list[TraceRequest], n: int, costs: Costs, devices_each: int) -> Outcome:
    lives = [_Live(r, r.arrival, math.nan, r.output - 1) for r in trace]
    for k in range(n):
        _decode_instance(lives[k::n], costs, prefills=True)
    return _outcome(f"{n} co-located", n * devices_each, lives)


def disaggregated(trace: list[TraceRequest], x: int, y: int, costs: Costs, devices_each: int) -> Outcome:
    free = [(0.0, k) for k in range(x)]  # prefill instances: (free at, index)
    heapq.heapify(free)
    lives, by_decode = [], [[] for _ in range(y)]
    ends: list[list[float]] = [[] for _ in range(y)]  # estimated finish times, for the least-held choice
    for r in trace:
        at, k = heapq.heappop(free)
        done = max(at, r.arrival) + costs.prefill(r.prompt)
        heapq.heappush(free, (done, k))
        ready = done + costs.transfer(r.prompt)
        live = _Live(r, ready, ready, r.output - 1)
        d = min(range(y), key=lambda j: sum(1 for e in ends[j] if e > ready))
        ends[d].append(ready + (r.output - 1) * costs.step(1, r.prompt))
        by_decode[d].append(live)
        lives.append(live)
    for group in by_decode:
        _decode_instance(group, costs)
    return _outcome(f"{x}P{y}D", (x + y) * devices_each, lives)


def search(trace: list[TraceRequest], costs: Costs, devices_each: int, max_instances: int) -> list[Outcome]:
    """Every co-located count and every xPyD up to max_instances instances, fewest devices first."""
    out = []
    for n in range(1, max_instances + 1):
        out.append(colocated(trace, n, costs, devices_each))
        out += [disaggregated(trace, x, n - x, costs, devices_each) for x in range(1, n)]
    return out
