"""1P1D against 2 co-located replicas on this machine: the same long-prompt requests, the same arrival
times, the same cores (each deployment runs two engine processes, each pinned to its half of the
cores with as many threads). A request is good when it meets both the TTFT and the TPOT SLO;
goodput = good requests / s. Under the table, each engine's time between steps (engine/step_clock.py).

Co-located replicas each take every other request (round robin) and run its prefill between their
decode steps, so a prefill stalls the decodes in flight there (TPOT suffers); 1P1D runs every prefill
on one worker and every decode on the other, and pays the KV transfer instead."""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

from ridgeline.bench.loadgen import LoadConfig, RequestSpec, arrival_times, send_one, summarize
from ridgeline.disagg.launch import placement
from ridgeline.engine.step_clock import format_breakdown


def _prompts(n: int, length: int, vocab: int) -> list[list[int]]:
    """Distinct deterministic token ids (no shared prefix: nothing comes from the prefix cache)."""
    return [[(1009 + 7919 * (i * 131 + 7) + 31 * j + (j * j) % 97) % (vocab - 200) + 100 for j in range(length)]
            for i in range(n)]


async def _drive(urls: list[str], specs: list[RequestSpec], times: list[float], cfg: LoadConfig):
    import time

    import httpx

    clients = [httpx.AsyncClient(base_url=u, timeout=httpx.Timeout(cfg.timeout, connect=60)) for u in urls]
    t0 = time.perf_counter()

    async def one(i: int):
        delay = t0 + times[i] - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        return await send_one(clients[i % len(clients)], specs[i], i, cfg, t0)

    try:
        results = await asyncio.gather(*(one(i) for i in range(len(specs))))
    finally:
        for c in clients:
            await c.aclose()
    return list(results), time.perf_counter() - t0


def _serve(model: str, extra: list[str], threads: int | None):
    from ridgeline.bench.serve import LaunchedServer

    cmd = [sys.executable, "-m", "ridgeline.cli", "serve", model, "--host", "127.0.0.1", "--port", "0", "--quiet",
           "--served-model-name", "bench", *extra]
    env_before = os.environ.get("OMP_NUM_THREADS")
    if threads is not None:
        os.environ["OMP_NUM_THREADS"] = str(threads)
    try:
        return LaunchedServer(cmd, echo=None).start()
    finally:
        if threads is not None:
            if env_before is None:
                os.environ.pop("OMP_NUM_THREADS", None)
            else:
                os.environ["OMP_NUM_THREADS"] = env_before


def _pin(pid: int, cores: list[int]) -> None:
    """Pin every thread of a started server to `cores` (threads it starts later inherit it); [] leaves it."""
    if not cores:
        return
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), cores)
        except OSError:  # a thread that just ended
            pass


def _check_front(url: str) -> None:
    import httpx

    from ridgeline.errors import RidgelineError

    if httpx.get(url + "/disagg/workers", timeout=180).status_code != 200:
        raise RidgelineError(f"{url} is not a disaggregated front (no /disagg/workers): the 1P1D run would "
                             "measure a single worker")


def _steps(url: str, path: str) -> dict:
    """{engine name: its step-time counters} from a deployment's info route ({} if it does not answer)."""
    import httpx

    try:
        info = httpx.get(url + path, timeout=180).json()
    except (httpx.HTTPError, ValueError) as e:
        print(f"no step counters from {url}{path}: {type(e).__name__} {e}", file=sys.stderr)
        return {}
    if "workers" not in info:
        return {"replica": info["steps"]} if "steps" in info else {}
    count: dict[str, int] = {}
    out = {}
    for w in info["workers"]:
        if "steps" in w:
            count[w["role"]] = count.get(w["role"], 0) + 1
            out[f"{w['role']} worker {count[w['role']]}"] = w["steps"]
    return out


def _row(name: str, s: dict, steps: dict) -> dict:
    return {"deployment": name, "steps": steps, "completed": s["completed"], "failed": s["failed"],
            "good": s["good_requests"],
            "goodput_rps": s["goodput"], "ttft_p50_s": s["ttft_s"]["p50"], "ttft_p90_s": s["ttft_s"]["p90"],
            "tpot_p50_s": s["tpot_s"]["p50"], "tpot_p90_s": s["tpot_s"]["p90"], "duration_s": s["duration_s"]}


def run_goodput(args: argparse.Namespace) -> dict:
    from ridgeline.advisor.model_config import resolve_spec

    vocab = resolve_spec(args.model).vocab_size
    specs = [RequestSpec(p) for p in _prompts(args.num_requests, args.prompt_len, vocab)]
    times = arrival_times(len(specs), args.request_rate, 0)
    if args.trace_out:
        with open(args.trace_out, "w") as f:
            for t in times:
                f.write(json.dumps({"arrival": round(t, 4), "prompt_tokens": args.prompt_len,
                                    "output_tokens": args.output_len}) + "\n")
    cfg = LoadConfig("completions", "ids", "bench", args.output_len, timeout=1800.0)
    slo = {"ttft": args.ttft_slo_ms / 1e3, "tpot": args.tpot_slo_ms / 1e3}
    engine = ["--kv-cache-dtype", args.kv_cache_dtype, "--max-waiting", "4096"]
    places = placement(2, True)  # the cores `serve --disaggregate 1P1D` gives its two workers
    rows = []
    with _serve(args.model, engine + ["--disaggregate", "1P1D", "--kv-connector", args.kv_connector], None) as pd:
        _check_front(pd.url)
        results, duration = asyncio.run(_drive([pd.url], specs, times, cfg))
        steps = _steps(pd.url, "/disagg/workers")
    rows.append(_row(f"1P1D ({args.kv_connector})", summarize(results, duration, slo), steps))
    with _serve(args.model, engine, places[0][1]) as a, _serve(args.model, engine, places[1][1]) as b:
        for server, (cores, _) in zip((a, b), places):
            _pin(server.proc.pid, cores)
        results, duration = asyncio.run(_drive([a.url, b.url], specs, times, cfg))
        steps = {f"replica {i + 1}": s for i, u in enumerate((a.url, b.url)) for s in _steps(u, "/info").values()}
    rows.append(_row("2 co-located replicas", summarize(results, duration, slo), steps))
    load = os.getloadavg()[0]
    out = {"model": args.model, "prompt_len": args.prompt_len, "output_len": args.output_len,
           "num_requests": args.num_requests, "request_rate": args.request_rate, "ttft_slo_s": slo["ttft"],
           "tpot_slo_s": slo["tpot"], "kv_cache_dtype": args.kv_cache_dtype, "rows": rows,
           "load_note": f"load average {load:.1f} on {os.cpu_count()} cores" + (" (under load)" if load > 1 else "")}
    print(format_goodput(out), flush=True)
    return out


def format_goodput(g: dict) -> str:
    lines = [f"goodput: {g['num_requests']} requests of {g['prompt_len']} prompt + {g['output_len']} output tokens at "
             f"{g['request_rate']:g}/s; SLO TTFT {g['ttft_slo_s'] * 1e3:.0f} ms, TPOT {g['tpot_slo_s'] * 1e3:.0f} ms "
             f"({g['load_note']})",
             f"{'deployment':>24} {'good':>5} {'goodput/s':>9} {'TTFT p50':>9} {'TTFT p90':>9} {'TPOT p50':>9} "
             f"{'TPOT p90':>9}"]
    for r in g["rows"]:
        lines.append(f"{r['deployment']:>24} {r['good']:>2}/{r['completed'] + r['failed']:<2} {r['goodput_rps']:>9.3f} "
                     f"{r['ttft_p50_s']:>8.2f}s {r['ttft_p90_s']:>8.2f}s {r['tpot_p50_s'] * 1e3:>7.0f}ms "
                     f"{r['tpot_p90_s'] * 1e3:>7.0f}ms")
    lines += ["where the time between steps went (each engine's step thread; a decode's TPOT is about one step):"]
    for r in g["rows"]:
        lines += ["  " + format_breakdown(f"{r['deployment']}, {name}", t) for name, t in r.get("steps", {}).items()]
    return "\n".join(lines)
