"""`ridgeline bench routing`: round-robin against cache-aware routing over N replicas on a
multi-tenant workload (bench/routing_workload.py), each replica's KV pool sized to hold about
--pool-tenants of the tenants' prefixes. Per policy, fresh replicas (processes, the cores split)
and a router; the same requests at the same arrival times; reports the prefix-cache hit rate (summed
over the replicas' counters), TTFT (streamed, to the first generated text) and each replica's share
of the requests. Runs alternate between the policies (--repeats) so a loaded machine slows both."""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from dataclasses import asdict

import httpx

from ridgeline.cli_parser import output_file, positive_float, positive_int


def add_routing_parser(bsub) -> argparse.ArgumentParser:
    p = bsub.add_parser("routing", help="round-robin vs cache-aware routing over replicas, multi-tenant prompts",
                        description=__doc__)
    p.add_argument("--model", default="smollm2-135m", help="HF folder, .gguf file, hub id, or built-in alias")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"], help="compute dtype")
    p.add_argument("--replicas", type=positive_int, default=2, help="replica processes")
    p.add_argument("--policies", default="round-robin,cache-aware", help="comma-separated routing policies")
    p.add_argument("--tenants", type=positive_int, default=8, help="distinct system prompts")
    p.add_argument("--prefix-tokens", type=positive_int, default=1000, help="tokens of each system prompt")
    p.add_argument("--requests-per-tenant", type=positive_int, default=6, help="requests sharing each prompt")
    p.add_argument("--question-words", type=positive_int, default=12, help="words of each request's own question")
    p.add_argument("--max-tokens", type=positive_int, default=8, help="tokens generated per request")
    p.add_argument("--rate", type=positive_float, default=1.0, help="requests per second, evenly spaced")
    p.add_argument("--pool-tenants", type=positive_float, default=4.5,
                   help="each replica's KV pool holds this many tenants' prompts (plus the requests' own tokens)")
    p.add_argument("--repeats", type=positive_int, default=1, help="runs of each policy, alternating")
    p.add_argument("--seed", type=int, default=0, help="workload seed")
    p.add_argument("--json", type=output_file, default=None, metavar="FILE", help="also write the results here (default: only the table on stdout)")
    p.set_defaults(func=cmd_routing)
    return p


def pool_bytes(model: str, dtype: str, tokens: int, block_size: int = 16) -> tuple[int, str]:
    """KV bytes for `tokens` tokens of this model at this dtype (rounded up to blocks), and the dtype."""
    import torch  # noqa: F401  (pick_dtype needs it)

    from ridgeline.kv_spec import KVCacheSpec, kv_formats
    from ridgeline.utils.device import pick_device, pick_dtype
    from ridgeline.weights.hf_config import load_arch_config
    from ridgeline.weights.resolve import resolve_model_source
    folder, _ = resolve_model_source(model, progress=False)
    arch = load_arch_config(folder)
    name = str(pick_dtype(dtype, pick_device("cpu")).dtype).removeprefix("torch.")
    k, v = kv_formats("auto", "auto", name, arch.head_dim)
    spec = KVCacheSpec(k, arch.num_layers, arch.num_kv_heads, arch.head_dim, block_size, v)
    return -(-tokens // block_size) * spec.bytes_per_block, name


async def _one(client: httpx.AsyncClient, url: str, body: dict, at: float, t0: float) -> dict:
    await asyncio.sleep(max(0.0, t0 + at - time.monotonic()))
    start = time.monotonic()
    ttft, events = None, 0
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            return {"error": f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"}
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            obj = json.loads(line[6:])
            if "error" in obj:
                return {"error": obj["error"]["message"]}
            events += 1
            if ttft is None and events >= 2:  # the first event is the role; the next carries generated text
                ttft = time.monotonic() - start
    return {"ttft": ttft if ttft is not None else time.monotonic() - start, "e2e": time.monotonic() - start}


async def _drive(url: str, requests: list[dict], rate: float) -> list[dict]:
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0)) as client:
        t0 = time.monotonic()
        return await asyncio.gather(*(_one(client, url, b, i / rate, t0) for i, b in enumerate(requests)))


def run_policy(policy: str, args, spec: dict, bodies: list[dict]) -> dict:
    from ridgeline.router.core import RouterSettings
    from ridgeline.router.launch import ProcessLauncher
    from ridgeline.router.serve import RouterThread, build_router
    from ridgeline.router.metrics import sum_metrics

    launcher = ProcessLauncher()
    try:
        replicas = launcher.start([spec] * args.replicas, kv_events=True)
        router = asyncio.run(build_router([r.url for r in replicas], RouterSettings(policy)))
        with RouterThread(router) as rt:
            results = asyncio.run(_drive(rt.url, bodies, args.rate))
            texts = [httpx.get(r.url + "/metrics").text for r in replicas]
            shares = [r.routed for r in router.replicas]
    finally:
        launcher.stop()
    totals = {s.name: s.value for m in sum_metrics(texts) for s in m.samples}
    ok = [r for r in results if "error" not in r]
    queries = totals.get("ridgeline_prefix_cache_queries_total", 0)
    hits = totals.get("ridgeline_prefix_cache_hits_total", 0)
    return {"policy": policy, "requests": len(results), "errors": len(results) - len(ok),
            "hit_rate": hits / queries if queries else 0.0, "mean_ttft_s": statistics.fmean(r["ttft"] for r in ok),
            "p90_ttft_s": sorted(r["ttft"] for r in ok)[int(0.9 * (len(ok) - 1))],
            "mean_e2e_s": statistics.fmean(r["e2e"] for r in ok),
            "share": [s / max(1, sum(shares)) for s in shares],
            "first_error": next((r["error"] for r in results if "error" in r), None)}


def cmd_routing(args: argparse.Namespace) -> int:
    from ridgeline.bench.routing_workload import routing_workload
    from ridgeline.router.data_parallel import replica_spec
    from ridgeline.serve.state import ServerSettings
    from ridgeline.weights.resolve import resolve_model_source
    from ridgeline.weights.tokenizer import Tokenizer

    folder, _ = resolve_model_source(args.model, progress=False)
    tok = Tokenizer(folder)
    workload = routing_workload(tok, args.tenants, args.prefix_tokens, args.requests_per_tenant,
                                args.question_words, args.seed)
    bodies = [{"model": "bench", "messages": m, "max_tokens": args.max_tokens, "temperature": 0, "stream": True,
               "ignore_eos": True} for _, m in workload]
    longest = max(len(tok.encode_chat(m)) for _, m in workload) + args.max_tokens
    kv, dtype = pool_bytes(args.model, args.dtype, int(args.pool_tenants * longest))
    engine = {"dtype": dtype, "kv_cache_memory": str(kv), "max_num_batched_tokens": 512}
    spec = replica_spec(args.model, engine, ServerSettings("bench", quiet=True))
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    print(f"routing bench: {args.model} ({dtype}), {args.replicas} replicas, {len(bodies)} requests = "
          f"{args.tenants} tenants x {args.requests_per_tenant}, prompts up to {longest} tokens, KV pool "
          f"{kv / 2**20:.1f} MiB each (~{args.pool_tenants:g} tenants), {args.rate:g} req/s", file=sys.stderr)
    runs = []
    for rep in range(args.repeats):
        for policy in policies:
            runs.append({**run_policy(policy, args, spec, bodies), "repeat": rep})
            print(_row(runs[-1]), file=sys.stderr, flush=True)
    report = summarize(runs, policies)
    print(report["table"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": {k: v for k, v in vars(args).items() if k != "func"}, "runs": runs,
                       "summary": report["summary"]}, f, indent=2)
    return 0


def _row(r: dict) -> str:
    shares = " / ".join(f"{s:.0%}" for s in r["share"])
    return (f"| {r['policy']} | {r['hit_rate']:.1%} | {r['mean_ttft_s']:.3f} | {r['p90_ttft_s']:.3f} | "
            f"{r['mean_e2e_s']:.3f} | {shares} | {r['errors']} |")


def summarize(runs: list[dict], policies: list[str]) -> dict:
    mean = {p: {k: statistics.fmean(r[k] for r in runs if r["policy"] == p)
                for k in ("hit_rate", "mean_ttft_s", "p90_ttft_s", "mean_e2e_s")} for p in policies}
    lines = ["| policy | prefix hit rate | mean TTFT (s) | p90 TTFT (s) | mean e2e (s) | requests per replica "
             "| errors |",
             "|---|---|---|---|---|---|---|"] + [_row(r) for r in runs]
    summary = {"by_policy": mean}
    if "round-robin" in mean and "cache-aware" in mean:
        rr, ca = mean["round-robin"], mean["cache-aware"]
        summary["hit_rate_gain"] = ca["hit_rate"] / rr["hit_rate"] if rr["hit_rate"] else float("inf")
        summary["ttft_speedup"] = rr["mean_ttft_s"] / ca["mean_ttft_s"]
        summary["max_share_cache_aware"] = max(max(r["share"]) for r in runs if r["policy"] == "cache-aware")
        lines.append(f"\ncache-aware vs round-robin: hit rate x{summary['hit_rate_gain']:.2f}, mean TTFT "
                     f"{summary['ttft_speedup']:.2f}x lower, busiest replica {summary['max_share_cache_aware']:.0%} "
                     "of the requests")
    return {"table": "\n".join(lines), "summary": summary}
