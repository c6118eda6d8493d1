"""GET /console/api/live: the engine's own counters (the ones /metrics exports) as one JSON object, with
a short time series for the console's charts and the advisor's diagnosis of the wall on the live numbers.

Samples are taken when the view is read (at most one per MIN_INTERVAL_S), so an idle console costs
nothing; rates are differences between consecutive samples."""
from __future__ import annotations

import statistics
import time
from collections import deque
from dataclasses import dataclass

from ridgeline.serve.console.live_wall import live_wall, precisions, served_spec
from ridgeline.serve.state import ServerState

SERIES_LEN = 120  # samples kept for the charts
MIN_INTERVAL_S = 0.25
WALL_INTERVAL_S = 2.0  # the diagnosis is recomputed at most this often


@dataclass(frozen=True)
class Sample:
    t: float  # time.monotonic()
    prompt_total: float
    generated_total: float
    running: int
    waiting: int
    kv_used: int
    kv_cached: int


def percentiles(values: list[float]) -> dict | None:
    if not values:
        return None
    if len(values) == 1:
        return {"p50": values[0], "p90": values[0], "p99": values[0], "n": 1}
    q = statistics.quantiles(values, n=100, method="inclusive")
    return {"p50": q[49], "p90": q[89], "p99": q[98], "n": len(values)}


class LiveView:
    def __init__(self, state: ServerState):
        self.state = state
        self.samples: deque[Sample] = deque(maxlen=SERIES_LEN)
        self._wall: tuple[float, tuple, dict] | None = None  # (time, inputs, wall)

    def _sample(self) -> Sample:
        """The counters now; kept for the series unless the last kept one is under MIN_INTERVAL_S old."""
        r, ae = self.state.metrics.registry, self.state.async_engine
        s = ae.stats
        now = Sample(time.monotonic(), r.get_sample_value("ridgeline_prompt_tokens_total") or 0.0,
                     r.get_sample_value("ridgeline_generation_tokens_total") or 0.0,
                     ae.num_running, ae.num_waiting, s.kv_blocks_used, s.kv_blocks_cached)
        if not self.samples or now.t - self.samples[-1].t >= MIN_INTERVAL_S:
            self.samples.append(now)
        return now

    def series(self) -> list[dict]:
        xs = list(self.samples)
        return [{"t": x.t - xs[-1].t, "running": x.running, "waiting": x.waiting, "kv_used": x.kv_used,
                 "kv_cached": x.kv_cached, "generation_tps": _rate(prev, x, "generated_total"),
                 "prompt_tps": _rate(prev, x, "prompt_total")} for prev, x in zip([None] + xs[:-1], xs)]

    def wall(self, hardware: str) -> dict:
        """Recomputed when the inputs change (hardware, a request finished, the running count), at most
        every WALL_INTERVAL_S otherwise."""
        st, now = self.state, time.monotonic()
        recent, running = list(st.metrics.recent), st.async_engine.num_running
        key = (hardware, id(recent[-1]) if recent else None, running)
        if self._wall and self._wall[1] == key and now - self._wall[0] < WALL_INTERVAL_S:
            return self._wall[2]
        wall = live_wall(st.engine, st.settings.served_model_name, hardware, recent, running)
        self._wall = (now, key, wall)
        return wall

    def snapshot(self, hardware: str) -> dict:
        last = self._sample()
        st = self.state
        s, info = st.async_engine.stats, st.engine.info
        series = self.series()
        recent = list(st.metrics.recent)
        prompt = sum(r.prompt_tokens for r in recent)
        weights, kv = precisions(info, served_spec(st.engine, st.settings.served_model_name))
        return {
            "model": st.settings.served_model_name, "running": last.running, "waiting": last.waiting,
            "kv": {"block_size": info.block_size, "total": s.kv_blocks_total, "tiers": _tiers(s)},
            "tokens": {"prompt_total": last.prompt_total, "generated_total": last.generated_total,
                       "generation_tps": series[-1]["generation_tps"], "prompt_tps": series[-1]["prompt_tps"]},
            "prefix_cache": {"enabled": info.prefix_caching, "queries": s.prefix_cache_queries,
                             "hits": s.prefix_cache_hits, "evictions": s.prefix_cache_evictions},
            "recent": {"n": len(recent), "window": st.metrics.recent.maxlen,
                       "prefix_hit_rate": sum(r.cached_tokens for r in recent) / prompt if prompt else None,
                       "ttft": percentiles([r.ttft for r in recent if r.ttft is not None]),
                       "tpot": percentiles([r.tpot for r in recent if r.tpot is not None]),
                       "e2e": percentiles([r.e2e for r in recent])},
            "speculative": _spec(s.speculative, info.speculative),
            "formats": {"dtype": str(info.dtype).removeprefix("torch."), "quantization": info.quantization,
                        "weights": info.weight_formats, "weight_bytes": info.weight_bytes,
                        "kv": info.kv_spec.format_names, "advisor": {"weights": weights, "kv": kv}},
            "preemptions": s.num_preemptions, "wall": self.wall(hardware), "series": series}


def _rate(prev: Sample | None, x: Sample, field: str) -> float:
    if prev is None or x.t <= prev.t:
        return 0.0
    return (getattr(x, field) - getattr(prev, field)) / (x.t - prev.t)


def _tiers(s) -> list[dict]:
    pool = {"name": "pool", "used": s.kv_blocks_used, "cached": s.kv_blocks_cached, "free": s.kv_blocks_free}
    if s.kv_tier is None:
        return [pool]
    total, cached, free = s.kv_tier_slots
    t = s.kv_tier_stats
    return [pool, {"name": s.kv_tier, "used": total - cached - free, "cached": cached, "free": free,
                   "hits": t.hits, "stores": t.stores, "loads": t.loads}]


def _spec(stats, described: str | None) -> dict | None:
    if stats is None:
        return None
    return {"method": described, "acceptance_rate": stats.acceptance_rate,
            "by_position": stats.acceptance_by_position, "tokens_per_step": stats.tokens_per_step,
            "drafted": stats.proposed, "accepted": stats.accepted}
