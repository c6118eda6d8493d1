"""Prometheus metrics for /metrics, on a registry of their own (several servers may share a process)."""
from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from ridgeline.engine.async_engine import AsyncEngine
from ridgeline.engine.outputs import RequestOutput
from ridgeline.distributed import expert_load
from ridgeline.engine.constraints import StructuredStats
from ridgeline.engine.spec_stats import SpecStats

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_PER_TOKEN = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5)
_LAG = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
LAG_PROBE_S = 0.05  # the event-loop probe sleeps this long; lateness past it is the loop's lag
RECENT = 100  # finished requests kept for the console's live view (percentiles, prefix hit rate)


@dataclass(frozen=True)
class Finished:
    """One request that finished every choice: what the histograms observed, kept for exact percentiles."""
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    ttft: float | None
    tpot: float | None
    e2e: float


class ServerMetrics:
    def __init__(self, async_engine: AsyncEngine):
        r = self.registry = CollectorRegistry()
        self.requests = Counter("ridgeline_requests", "Finished sequences (choices) by finish status",
                                ["status"], registry=r)
        self.errors = Counter("ridgeline_request_errors", "Requests refused, by HTTP status", ["code"],
                              registry=r)
        self.prompt_tokens = Counter("ridgeline_prompt_tokens", "Prompt tokens of accepted requests", registry=r)
        self.generation_tokens = Counter("ridgeline_generation_tokens", "Generated tokens", registry=r)
        self.ttft = Histogram("ridgeline_time_to_first_token_seconds", "Arrival to first token",
                              buckets=_LATENCY, registry=r)
        self.tpot = Histogram("ridgeline_time_per_output_token_seconds", "Mean time between output tokens "
                              "after the first, per request", buckets=_PER_TOKEN, registry=r)
        self.e2e = Histogram("ridgeline_e2e_request_latency_seconds", "Arrival to last token",
                             buckets=_LATENCY, registry=r)
        self.loop_lag = Histogram("ridgeline_event_loop_lag_seconds", f"How late the event loop woke a probe "
                                  f"that sleeps {LAG_PROBE_S:g} s (work holding the loop delays every request)",
                                  buckets=_LAG, registry=r)
        r.register(_EngineCollector(async_engine))
        self.recent: deque[Finished] = deque(maxlen=RECENT)  # appended on the event loop only

    def count_error(self, status: int) -> None:
        self.errors.labels(str(status)).inc()

    def track(self, num_prompt_tokens: int, n: int, arrival: float) -> RequestTracker:
        return RequestTracker(self, num_prompt_tokens, n, arrival)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    async def probe_loop(self) -> None:
        """Runs for the server's life on its event loop: each wake-up's lateness into loop_lag."""
        loop = asyncio.get_running_loop()
        while True:
            t = loop.time()
            await asyncio.sleep(LAG_PROBE_S)
            self.loop_lag.observe(max(0.0, loop.time() - t - LAG_PROBE_S))


class RequestTracker:
    """Latency and token counts of one HTTP request, fed the cumulative outputs it reads."""

    def __init__(self, metrics: ServerMetrics, num_prompt_tokens: int, n: int, arrival: float):
        self.m = metrics
        self.n = n  # choices per engine request
        self.arrival = arrival  # time.monotonic() when the request was admitted
        self.first: float | None = None
        self.seen: dict[str, int] = {}  # engine request id -> output tokens counted so far
        self.longest = 0  # tokens of the longest choice: the decode steps TPOT divides by
        self.final: dict[str, RequestOutput] = {}
        self.closed = False
        self.num_prompt_tokens = num_prompt_tokens
        metrics.prompt_tokens.inc(num_prompt_tokens)

    def update(self, out: RequestOutput) -> None:
        total = sum(len(c.token_ids) for c in out.outputs)
        delta = total - self.seen.get(out.request_id, 0)
        self.longest = max([self.longest] + [len(c.token_ids) for c in out.outputs])
        if delta > 0:
            self.seen[out.request_id] = total
            self.m.generation_tokens.inc(delta)
            if self.first is None:
                self.first = time.monotonic()
                self.m.ttft.observe(self.first - self.arrival)
        if out.finished:
            self.final[out.request_id] = out

    def close(self, request_ids: list[str], error: bool = False) -> None:
        """Record how each choice ended: its finish reason, or abort/error if it never finished."""
        if self.closed:
            return
        self.closed = True
        now = time.monotonic()
        for rid in request_ids:
            out = self.final.get(rid)
            if out is None:
                self.m.requests.labels("error" if error else "abort").inc(self.n)
                continue
            for c in out.outputs:
                self.m.requests.labels(c.finish_reason or "abort").inc()
        if len(self.final) == len(request_ids):
            self.m.e2e.observe(now - self.arrival)
            tpot = None
            if self.first is not None and self.longest > 1:
                tpot = (now - self.first) / (self.longest - 1)
                self.m.tpot.observe(tpot)
            outs = self.final.values()
            self.m.recent.append(Finished(
                self.num_prompt_tokens, sum(o.num_cached_tokens for o in outs),
                sum(len(c.token_ids) for o in outs for c in o.outputs),
                None if self.first is None else self.first - self.arrival, tpot, now - self.arrival))


class _EngineCollector(Collector):
    """Gauges read at scrape time: the step thread's snapshot and the event loop's counts."""

    def __init__(self, async_engine: AsyncEngine):
        self.ae = async_engine

    def collect(self):
        s = self.ae.stats
        yield GaugeMetricFamily("ridgeline_num_requests_running", "Requests generating tokens",
                                value=self.ae.num_running)
        yield GaugeMetricFamily("ridgeline_num_requests_waiting", "Requests accepted without a first token",
                                value=self.ae.num_waiting)
        yield GaugeMetricFamily("ridgeline_kv_cache_blocks_used", "KV cache blocks in use by requests",
                                value=s.kv_blocks_used)
        yield GaugeMetricFamily("ridgeline_kv_cache_blocks_cached", "KV cache blocks holding prefix-cache "
                                "content no request uses (evictable)", value=s.kv_blocks_cached)
        yield GaugeMetricFamily("ridgeline_kv_cache_blocks_free", "KV cache blocks holding nothing reusable",
                                value=s.kv_blocks_free)
        yield GaugeMetricFamily("ridgeline_kv_cache_blocks_total", "KV cache blocks", value=s.kv_blocks_total)
        yield CounterMetricFamily("ridgeline_num_preemptions", "Requests preempted for KV blocks",
                                  value=s.num_preemptions)
        peak, before, at_first = s.running_peaks
        yield GaugeMetricFamily("ridgeline_num_requests_running_max", "Most requests holding KV blocks at once "
                                "since start", value=peak)
        yield GaugeMetricFamily("ridgeline_num_requests_running_max_before_preemption", "Most requests holding KV "
                                "blocks at once before the first preemption (then frozen)", value=before)
        yield GaugeMetricFamily("ridgeline_num_requests_running_at_first_preemption", "Requests holding KV blocks "
                                "when the first preemption happened, the preempted one included (0: none yet)",
                                value=at_first)
        yield CounterMetricFamily("ridgeline_recomputed_tokens", "Computed tokens that preemption dropped and "
                                  "readmission computed again (not swapped, not found in the prefix cache)",
                                  value=s.num_recomputed_tokens)
        yield CounterMetricFamily("ridgeline_prefix_cache_queries", "Tokens looked up in the prefix cache "
                                  "(each request's length at admission)", value=s.prefix_cache_queries)
        yield CounterMetricFamily("ridgeline_prefix_cache_hits", "Tokens served from the prefix cache",
                                  value=s.prefix_cache_hits)
        yield CounterMetricFamily("ridgeline_prefix_cache_evictions", "Cached KV blocks evicted to hold "
                                  "other tokens", value=s.prefix_cache_evictions)
        if s.kv_tier_stats is not None:
            yield from _tier_metrics(s)
        if s.speculative is not None:
            yield from _spec_metrics(s.speculative)
        if s.structured is not None:
            yield from _structured_metrics(s.structured)
        yield from expert_load.metric_families(self.ae.engine.runner.model)


def _tier_metrics(s):
    """The second KV tier's counters, labelled by tier; hits also for the pool, so hits by tier sum to
    ridgeline_prefix_cache_hits."""
    t, name, bb = s.kv_tier_stats, s.kv_tier, s.kv_tier_block_bytes
    hits = CounterMetricFamily("ridgeline_kv_cache_hits_by_tier", "Prompt tokens served from cached KV, by the "
                               "tier that held them (pool or the offload tier)", labels=["tier"])
    hits.add_metric(["pool"], s.prefix_cache_hits - t.hits)
    hits.add_metric([name], t.hits)
    yield hits
    for metric, value, doc in (
            ("hits", t.hits, "Prompt tokens served from the offload tier (loaded back into the pool)"),
            ("stores", t.stores, "KV blocks written to the offload tier (evicted prefix blocks, swapped-out blocks)"),
            ("loads", t.loads, "KV blocks loaded back from the offload tier"),
            ("stored_bytes", t.stores * bb, "Bytes written to the offload tier"),
            ("loaded_bytes", t.loads * bb, "Bytes loaded back from the offload tier"),
            ("evictions", t.evictions, "Cached blocks dropped from the offload tier to make room"),
            ("dropped", t.dropped, "KV blocks the offload tier had no room for"),
            ("swaps_out", t.swaps_out, "Preempted requests whose KV blocks went to the offload tier"),
            ("swaps_in", t.swaps_in, "Swapped-out requests whose KV blocks came back"),
            ("swap_fallbacks", t.swap_fallbacks, "Preemptions that recomputed because the offload tier was full")):
        fam = CounterMetricFamily(f"ridgeline_kv_tier_{metric}", doc, labels=["tier"])
        fam.add_metric([name], value)
        yield fam


def _structured_metrics(st: StructuredStats):
    """Structured outputs: mean mask time per step = mask_seconds / mask_steps; share of tokens forced =
    forced_tokens / tokens (with --speculative-method grammar the spec_decode counters are its drafts)."""
    for name, value, doc in (
            ("choices", st.choices, "Constrained choices started (each of n counts)"),
            ("compiles", st.compiles, "Grammars compiled (cache misses)"),
            ("compile_seconds", st.compile_seconds, "Time spent compiling grammars"),
            ("mask_steps", st.mask_steps, "Steps that built allowed-token masks"),
            ("mask_rows", st.mask_rows, "Allowed-token mask rows built (one per sampled position)"),
            ("mask_seconds", st.mask_seconds, "Time the step thread spent building masks"),
            ("tokens", st.tokens, "Output tokens of constrained choices"),
            ("forced_tokens", st.forced_tokens, "Output tokens of constrained choices that the grammar forced")):
        yield CounterMetricFamily(f"ridgeline_structured_{name}", doc, value=value)


def _spec_metrics(spec: SpecStats):
    """Speculative decoding counters; the mean accepted length is 1 + accepted / verify steps, the
    acceptance at position j is accepted_by_position{position=j} / drafted_by_position{position=j}."""
    yield CounterMetricFamily("ridgeline_spec_decode_draft_tokens", "Drafted tokens verified by the target",
                              value=spec.proposed)
    yield CounterMetricFamily("ridgeline_spec_decode_accepted_tokens", "Drafted tokens the target accepted",
                              value=spec.accepted)
    yield CounterMetricFamily("ridgeline_spec_decode_verify_steps", "Sequence-steps that verified drafts",
                              value=spec.steps)
    yield CounterMetricFamily("ridgeline_spec_decode_draft_seconds", "Time spent drafting", value=spec.draft_time)
    for name, values, doc in (("accepted_by_position", spec.accepted_at, "Drafted tokens accepted, by draft position"),
                              ("drafted_by_position", spec.proposed_at, "Drafted tokens verified, by draft position")):
        fam = CounterMetricFamily(f"ridgeline_spec_decode_{name}", doc, labels=["position"])
        for j, n in enumerate(values):
            fam.add_metric([str(j)], n)
        yield fam
