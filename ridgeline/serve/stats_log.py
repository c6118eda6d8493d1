"""While the server is busy, one throughput line every `interval` seconds (as vLLM logs): prompt and
generation tokens per second since the last line, requests running and waiting, KV cache in use."""
from __future__ import annotations

import asyncio
import logging
import time

from ridgeline.serve.state import ServerState

log = logging.getLogger("ridgeline.serve")


async def log_throughput(state: ServerState, interval: float) -> None:
    """Runs until cancelled (the app's lifespan owns the task)."""
    last = _totals(state)
    while True:
        await asyncio.sleep(interval)
        now = _totals(state)
        ae = state.async_engine
        if now[:2] != last[:2] or ae.num_running or ae.num_waiting:
            dt = max(now[2] - last[2], 1e-9)
            s = ae.stats
            kv = 100.0 * s.kv_blocks_used / s.kv_blocks_total if s.kv_blocks_total else 0.0
            log.info("throughput: prompt %.1f tok/s, generation %.1f tok/s; %d running, %d waiting; "
                     "KV cache %.1f%% used", (now[0] - last[0]) / dt, (now[1] - last[1]) / dt,
                     ae.num_running, ae.num_waiting, kv)
        last = now


def _totals(state: ServerState) -> tuple[float, float, float]:
    r = state.metrics.registry
    return (r.get_sample_value("ridgeline_prompt_tokens_total") or 0.0,
            r.get_sample_value("ridgeline_generation_tokens_total") or 0.0, time.monotonic())
