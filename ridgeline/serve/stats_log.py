"""While the server is busy, one throughput line every `interval` seconds (as vLLM logs): prompt tokens
computed and generation tokens per second since the last line, requests running (with a token) and waiting
(accepted, no token yet), KV cache in use, and the prompts being computed: a long prompt's prefill shows
its progress instead of "0 running, 1 waiting" until its first token."""
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
            log.info(throughput_line(now, last, ae.num_running, ae.num_waiting, ae.stats))
        last = now


def throughput_line(now: tuple, last: tuple, running: int, waiting: int, stats) -> str:
    dt = max(now[2] - last[2], 1e-9)
    kv = 100.0 * stats.kv_blocks_used / stats.kv_blocks_total if stats.kv_blocks_total else 0.0
    line = (f"throughput: prompt {(now[0] - last[0]) / dt:.1f} tok/s, generation {(now[1] - last[1]) / dt:.1f} "
            f"tok/s; {running} running, {waiting} waiting; KV cache {kv:.1f}% used")
    rows, done, total = stats.prefill
    if rows:
        line += f"; prefill {done:,} of {total:,} prompt tokens ({rows} request{'s' if rows > 1 else ''})"
    return line


def _totals(state: ServerState) -> tuple[float, float, float]:
    """(prompt tokens computed, generation tokens, now): the first from the step thread's last snapshot."""
    r = state.metrics.registry
    return (float(state.async_engine.stats.prompt_tokens_scheduled),
            r.get_sample_value("ridgeline_generation_tokens_total") or 0.0, time.monotonic())
