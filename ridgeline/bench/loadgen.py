"""An asyncio load generator for any OpenAI-compatible server (Ridgeline, vLLM, llama.cpp's llama-server).

Each request streams `/v1/completions` (token-id or text prompt) or `/v1/chat/completions` with greedy
sampling, `ignore_eos` and `max_tokens`, so every request asks for the same number of output tokens.
A request's latencies are measured on the client from the moment it is sent: TTFT to the first chunk
carrying text (if none has text, e.g. only special tokens: the first chunk with a choice), inter-token
latencies between text chunks, e2e to the end of the stream. Output tokens come from the final `usage`
chunk (`stream_options.include_usage`) when the server sends one, else from the number of text chunks
(which undercounts when a server merges tokens into one chunk).

Arrivals: all at once (`request_rate=inf`) or Poisson at `request_rate` requests/s (exponential gaps from
a seeded RNG); `max_concurrency` caps the requests in flight (a closed loop when the rate is infinite).
"""
from __future__ import annotations

import asyncio
import json
import math
import random
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from ridgeline.errors import InvalidRequestError

PERCENTILES = (50, 90, 99)


@dataclass
class RequestSpec:
    """One request of the workload: its token ids, and the chat messages they were rendered from."""
    prompt_ids: list[int]
    messages: list[dict] | None = None
    text: str | None = None  # the prompt as text (decoded ids), for --prompt-format text
    schema: dict | None = None  # the JSON schema its reply is constrained to (structured workloads)
    schema_name: str | None = None
    tools: list[dict] | None = None  # sent with tool_choice required (the tools workload; chat only)


@dataclass
class RequestResult:
    index: int
    ok: bool = False
    error: str = ""
    sent: float = 0.0  # seconds after the benchmark started
    prompt_tokens: int = 0  # usage.prompt_tokens when reported, else the client's count
    output_tokens: int = 0
    output_tokens_source: str = "chunks"  # "usage" or "chunks"
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens (or llama.cpp timings.cache_n)
    ttft: float | None = None
    e2e: float | None = None
    itl: list[float] = field(default_factory=list)  # gaps between text chunks after the first
    text_chunks: int = 0

    @property
    def tpot(self) -> float | None:
        if self.ttft is None or self.e2e is None or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)

    def to_dict(self) -> dict:
        return {**asdict(self), "tpot": self.tpot}


@dataclass
class LoadConfig:
    endpoint: str  # "completions" or "chat"
    prompt_format: str  # "ids", "text" or "chat"
    model: str
    output_len: int
    request_rate: float = math.inf
    max_concurrency: int | None = None
    seed: int = 0
    stream_usage: bool = True
    timeout: float = 600.0
    temperature: float = 0.0
    extra_body: dict = field(default_factory=dict)


def request_body(spec: RequestSpec, cfg: LoadConfig, max_tokens: int | None = None) -> tuple[str, dict]:
    """(path, JSON body) of one streaming request."""
    body: dict = {"model": cfg.model, "max_tokens": max_tokens or cfg.output_len, "temperature": cfg.temperature,
                  "ignore_eos": True, "stream": True}
    if cfg.stream_usage:
        body["stream_options"] = {"include_usage": True}
    if cfg.prompt_format == "chat":
        if spec.messages is None:
            raise InvalidRequestError("--prompt-format chat needs the workload's chat messages")
        path, body["messages"] = "/v1/chat/completions", spec.messages
    elif cfg.prompt_format == "text":
        path, body["prompt"] = "/v1/completions", spec.text
    else:
        path, body["prompt"] = "/v1/completions", spec.prompt_ids
    if spec.tools is not None:
        if not path.endswith("chat/completions"):
            raise InvalidRequestError("the tools workload needs --prompt-format chat")
        body["tools"], body["tool_choice"] = spec.tools, "required"
    elif spec.schema is not None:  # OpenAI's spelling on chat, vLLM's on completions
        if path.endswith("chat/completions"):
            body["response_format"] = {"type": "json_schema", "json_schema": {
                "name": spec.schema_name or "reply", "schema": spec.schema, "strict": True}}
        else:
            body["structured_outputs"] = {"json": spec.schema}
    body.update(cfg.extra_body)
    return path, body


def _chunk_text(obj: dict) -> str:
    text = ""
    for choice in obj.get("choices") or []:
        if "text" in choice:
            text += choice.get("text") or ""
        delta = choice.get("delta") or {}
        text += (delta.get("content") or "") + (delta.get("reasoning_content") or "")
        for call in delta.get("tool_calls") or []:  # a call's name and arguments: output the client sees
            f = call.get("function") or {}
            text += (f.get("name") or "") + (f.get("arguments") or "")
    return text


def _error_message(obj) -> str:
    err = obj.get("error") if isinstance(obj, dict) else obj
    if isinstance(err, dict):
        return str(err.get("message") or err)
    return str(err)


async def send_one(client, spec: RequestSpec, index: int, cfg: LoadConfig, t0: float,
                   max_tokens: int | None = None) -> RequestResult:
    """Send one streaming request; never raises (failures are recorded in the result)."""
    res = RequestResult(index, prompt_tokens=len(spec.prompt_ids))
    path, body = request_body(spec, cfg, max_tokens)
    start = time.perf_counter()
    res.sent = start - t0
    last = first_choice = None
    usage = None
    try:
        async with client.stream("POST", path, json=body) as r:
            if r.status_code != 200:
                raw = (await r.aread()).decode(errors="replace")
                try:
                    msg = _error_message(json.loads(raw))
                except ValueError:
                    msg = raw[:300]
                res.error = f"HTTP {r.status_code}: {msg}"
                return res
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                now = time.perf_counter()
                try:
                    obj = json.loads(data)
                except ValueError:
                    res.error = f"bad stream chunk: {data[:200]}"
                    return res
                if isinstance(obj, dict) and obj.get("error") is not None:
                    res.error = f"in-band error: {_error_message(obj)}"
                    return res
                if first_choice is None and obj.get("choices"):
                    first_choice = now
                if _chunk_text(obj):
                    if last is None:
                        res.ttft = now - start
                    else:
                        res.itl.append(now - last)
                    last = now
                    res.text_chunks += 1
                if obj.get("usage"):
                    usage = obj["usage"]
                if obj.get("timings") and res.cached_tokens is None:  # llama.cpp's own field
                    cache_n = obj["timings"].get("cache_n")
                    if isinstance(cache_n, int):
                        res.cached_tokens = cache_n
        res.e2e = time.perf_counter() - start
    except Exception as e:  # transport errors, timeouts, a server that went away
        res.error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        return res
    if usage and isinstance(usage.get("completion_tokens"), int):
        res.output_tokens, res.output_tokens_source = usage["completion_tokens"], "usage"
        if isinstance(usage.get("prompt_tokens"), int):
            res.prompt_tokens = usage["prompt_tokens"]
        details = usage.get("prompt_tokens_details") or {}
        if isinstance(details.get("cached_tokens"), int):
            res.cached_tokens = details["cached_tokens"]
    else:
        res.output_tokens = res.text_chunks
    if res.ttft is None and first_choice is not None:
        res.ttft = first_choice - start  # no visible text (special tokens only): the first choice chunk
    if res.ttft is None:
        res.error = "the stream ended without any choice"
        return res
    res.ok = True
    return res


def arrival_times(n: int, rate: float, seed: int) -> list[float]:
    """Send times (seconds from the start) of n requests: all 0 for an infinite rate, else Poisson."""
    if math.isinf(rate):
        return [0.0] * n
    rng = random.Random(f"arrivals/{seed}")
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


async def run_load(base_url: str, specs: list[RequestSpec], cfg: LoadConfig, headers: dict | None = None,
                   on_done: Callable[[RequestResult], None] | None = None,
                   max_tokens: int | None = None) -> tuple[list[RequestResult], float]:
    """Send every spec on its schedule; returns the results (in spec order) and the duration in seconds
    (first send to last completion)."""
    import httpx

    cap = cfg.max_concurrency
    limits = httpx.Limits(max_connections=cap or None, max_keepalive_connections=cap or None,
                          keepalive_expiry=4.0)  # below uvicorn's 5 s keep-alive
    timeout = httpx.Timeout(cfg.timeout, connect=min(cfg.timeout, 60.0))
    sem = asyncio.Semaphore(cap) if cap else None
    times = arrival_times(len(specs), cfg.request_rate, cfg.seed)
    async with httpx.AsyncClient(base_url=base_url, headers=headers, limits=limits, timeout=timeout) as client:
        t0 = time.perf_counter()

        async def one(i: int, spec: RequestSpec) -> RequestResult:
            delay = t0 + times[i] - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if sem is None:
                res = await send_one(client, spec, i, cfg, t0, max_tokens)
            else:
                async with sem:
                    res = await send_one(client, spec, i, cfg, t0, max_tokens)
            if on_done is not None:
                on_done(res)
            return res

        results = await asyncio.gather(*(one(i, s) for i, s in enumerate(specs)))
        duration = time.perf_counter() - t0
    return list(results), duration


# ---------------------------------------------------------------- statistics

def percentile(values: list[float], p: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); nan for no values."""
    if not values:
        return math.nan
    xs = sorted(values)
    k = (len(xs) - 1) * p / 100
    lo = math.floor(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def distribution(values: list[float]) -> dict:
    d = {"count": len(values), "mean": sum(values) / len(values) if values else math.nan}
    for p in PERCENTILES:
        d[f"p{p}"] = percentile(values, p)
    d["max"] = max(values) if values else math.nan
    return d


def meets_slo(r: RequestResult, slo: dict) -> bool:
    if not r.ok:
        return False
    if slo.get("ttft") is not None and r.ttft > slo["ttft"]:
        return False
    if slo.get("tpot") is not None and r.tpot is not None and r.tpot > slo["tpot"]:
        return False
    if slo.get("e2e") is not None and r.e2e > slo["e2e"]:
        return False
    return True


def summarize(results: list[RequestResult], duration: float, slo: dict | None = None) -> dict:
    slo = {k: v for k, v in (slo or {}).items() if v is not None}
    ok = [r for r in results if r.ok]
    prompt = sum(r.prompt_tokens for r in ok)
    output = sum(r.output_tokens for r in ok)
    cached = [r.cached_tokens for r in ok if r.cached_tokens is not None]
    rate = (lambda x: x / duration) if duration > 0 else (lambda x: math.nan)
    s = {
        "duration_s": duration,
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "prompt_tokens": prompt,
        "output_tokens": output,
        "output_tokens_from_usage": sum(r.output_tokens_source == "usage" for r in ok),
        "cached_prompt_tokens": sum(cached) if cached else None,
        "request_throughput": rate(len(ok)),
        "output_throughput": rate(output),
        "total_token_throughput": rate(prompt + output),
        "ttft_s": distribution([r.ttft for r in ok]),
        "tpot_s": distribution([r.tpot for r in ok if r.tpot is not None]),
        "itl_s": distribution([x for r in ok for x in r.itl]),
        "e2e_s": distribution([r.e2e for r in ok]),
        "slo": slo or None,
        "good_requests": None,
        "goodput": None,
        "errors": _error_counts(results),
    }
    if slo:
        good = sum(meets_slo(r, slo) for r in results)
        s["good_requests"], s["goodput"] = good, rate(good)
    return s


def _error_counts(results: list[RequestResult]) -> list[dict]:
    """Failures grouped by message with the numbers left out: [{"error": first example, "count": n}]."""
    groups: dict[str, dict] = {}
    for r in results:
        if not r.ok:
            g = groups.setdefault(re.sub(r"\d+", "#", r.error[:300]), {"error": r.error[:300], "count": 0})
            g["count"] += 1
    return list(groups.values())


# ---------------------------------------------------------------- Prometheus

_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def parse_prometheus(text: str) -> dict[str, float]:
    """Sample name -> value, summed over label sets; a histogram's buckets also by name{le="..."}."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        out[m.group(1)] = out.get(m.group(1), 0.0) + value
        if m.group(1).endswith("_bucket") and m.group(2):
            le = re.search(r'le="([^"]*)"', m.group(2))
            if le:
                key = f'{m.group(1)}{{le="{le.group(1)}"}}'
                out[key] = out.get(key, 0.0) + value
    return out


LATE_S = 0.1  # an event-loop probe woken later than this counts as late


def loop_lag_delta(before: dict[str, float] | None, after: dict[str, float] | None) -> dict | None:
    """The server's event-loop probe between two scrapes (Ridgeline's ridgeline_event_loop_lag_seconds):
    probes, how many woke more than LATE_S late, and the mean lateness. None without it."""
    name = "ridgeline_event_loop_lag_seconds"
    key = f'{name}_bucket{{le="{LATE_S:g}"}}'
    if not before or not after or key not in after or key not in before:
        return None
    n = after[name + "_count"] - before[name + "_count"]
    on_time = after[key] - before[key]
    total = after[name + "_sum"] - before[name + "_sum"]
    return {"probes": n, "late": n - on_time, "late_s": LATE_S, "mean_lag_s": total / n if n else None}


def _find(samples: dict[str, float], suffix: str) -> float | None:
    """The counter ending in `suffix` (with or without `_total`): ridgeline_..., vllm:..."""
    for name in sorted(samples):
        if name.endswith(suffix + "_total"):
            return samples[name]
    for name in sorted(samples):
        if name.endswith(suffix):
            return samples[name]
    return None


def prefix_cache_delta(before: dict[str, float] | None, after: dict[str, float] | None) -> dict | None:
    """Prefix-cache queries, hits and hit rate between two scrapes; None when the server has no such counters."""
    if not before or not after:
        return None
    q0, h0 = _find(before, "prefix_cache_queries"), _find(before, "prefix_cache_hits")
    q1, h1 = _find(after, "prefix_cache_queries"), _find(after, "prefix_cache_hits")
    if None in (q0, h0, q1, h1):
        return None
    queries, hits = q1 - q0, h1 - h0
    d = {"queries": queries, "hits": hits, "hit_rate": hits / queries if queries > 0 else None}
    p0, p1 = _find(before, "num_preemptions"), _find(after, "num_preemptions")
    if p0 is not None and p1 is not None:
        d["preemptions"] = p1 - p0
    for key, name in (("tier_hits", "kv_tier_hits"), ("tier_loads", "kv_tier_loads"),
                      ("tier_stores", "kv_tier_stores"), ("swaps_out", "kv_tier_swaps_out"),
                      ("recomputed_tokens", "recomputed_tokens")):
        a, b = _find(before, name), _find(after, name)
        if a is not None and b is not None:  # a second KV tier (ridgeline --kv-offload)
            d[key] = b - a
    return d


def preemption_concurrency(before: dict[str, float] | None, after: dict[str, float] | None) -> dict | None:
    """The server's concurrency in KV terms (requests holding KV blocks) over the run: the most at once before
    its first preemption, how many held blocks at it, and the most since the server started. None when the
    server has no such gauges (only Ridgeline's). The first preemption's numbers belong to this run only when
    the server had not preempted before it (`first_preemption_in_run`); with none in the run they are None."""
    if not before or not after:
        return None
    peak = _find(after, "num_requests_running_max")
    p0, p1 = _find(before, "num_preemptions"), _find(after, "num_preemptions")
    if peak is None or p0 is None or p1 is None:
        return None
    in_run = p0 == 0 and p1 > 0
    return {"preemptions": p1 - p0, "first_preemption_in_run": in_run, "preempted_before_run": p0 > 0,
            "max_running_before_first_preemption": _find(after, "num_requests_running_max_before_preemption")
            if in_run else None,
            "running_at_first_preemption": _find(after, "num_requests_running_at_first_preemption") if in_run else None,
            "max_running_since_start": peak}
