"""`ridgeline bench routing`: round-robin against cache-aware routing over N replicas on a
multi-tenant workload (bench/routing_workload.py), each replica's KV pool sized to hold about
--pool-tenants of the tenants' prompts (default: its share of them, tenants / replicas, plus half a
prompt for the requests' own tokens). Per policy, a fresh `ridgeline serve --data-parallel-size N
--router-policy POLICY` process (its replicas processes, the cores split), warmed by short requests
through its router; the same requests in the same order, at most --concurrency in flight. Reports per run the prefix hit rate (each request's
usage.prompt_tokens_details.cached_tokens over its prompt tokens), TTFT (streamed, to the first
generated text), each replica's share of the requests, the share that reached its tenant's
most used replica, and how often the replica's cached tokens differ from the router's prediction
(the x-ridgeline-expected-cached-tokens header); then the ratios against the targets. Runs alternate
between the policies (--repeats) so a loaded machine slows both."""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

import httpx

from ridgeline.bench.routing_report import row, run_stats, summarize
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
    p.add_argument("--requests-per-tenant", type=positive_int, default=4, help="requests sharing each prompt")
    p.add_argument("--question-words", type=positive_int, default=12, help="words of each request's own question")
    p.add_argument("--max-tokens", type=positive_int, default=8, help="tokens generated per request")
    p.add_argument("--concurrency", type=positive_int, default=4,
                   help="requests in flight at most (sent in workload order as earlier ones finish)")
    p.add_argument("--rate", type=positive_float, default=None,
                   help="also space the requests' starts at this many per second (default: no spacing)")
    p.add_argument("--pool-tenants", type=positive_float, default=None,
                   help="each replica's KV pool holds this many tenants' prompts (default: tenants / replicas "
                        "+ 0.5, the half prompt for the requests' own tokens)")
    p.add_argument("--repeats", type=positive_int, default=1, help="runs of each policy, alternating")
    p.add_argument("--seed", type=int, default=0, help="workload seed")
    p.add_argument("--json", type=output_file, default=None, metavar="FILE",
                   help="also write the results and every request's record here (default: only the table)")
    p.set_defaults(func=cmd_routing)
    return p


def pool_bytes(model: str, dtype: str, tokens: int, block_size: int = 16) -> tuple[int, str]:
    """KV bytes for `tokens` tokens of this model at this dtype (rounded up to blocks), and the dtype."""
    import torch  # noqa: F401  (pick_dtype needs it)

    from ridgeline.kv_spec import KVCacheSpec, kv_formats
    from ridgeline.utils.device import pick_device, pick_dtype
    from ridgeline.weights.hf_config import load_arch_config
    from ridgeline.models.resolve import resolve_model_source
    folder, _ = resolve_model_source(model, progress=False)
    arch = load_arch_config(folder)
    name = str(pick_dtype(dtype, pick_device("cpu")).dtype).removeprefix("torch.")
    k, v = kv_formats("auto", "auto", name, arch.head_dim)
    spec = KVCacheSpec(k, arch.num_layers, arch.num_kv_heads, arch.head_dim, block_size, v)
    return -(-tokens // block_size) * spec.bytes_per_block, name


async def _one(client: httpx.AsyncClient, url: str, body: dict, slots: asyncio.Semaphore, at: float,
               t0: float) -> dict:
    async with slots:
        await asyncio.sleep(max(0.0, t0 + at - time.monotonic()))
        start = time.monotonic()
        ttft, events, usage = None, 0, {}
        async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                return {"error": f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"}
            replica = r.headers.get("x-ridgeline-replica", "")
            predicted = int(r.headers.get("x-ridgeline-expected-cached-tokens", 0))
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                obj = json.loads(line[6:])
                if "error" in obj:
                    return {"error": obj["error"]["message"]}
                if obj.get("usage"):
                    usage = obj["usage"]
                if not obj.get("choices"):
                    continue
                events += 1
                if ttft is None and events >= 2:  # the first event is the role; the next carries generated text
                    ttft = time.monotonic() - start
    end = time.monotonic() - start
    return {"ttft": ttft if ttft is not None else end, "e2e": end, "replica": replica, "predicted": predicted,
            "cached": (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0),
            "prompt_tokens": usage.get("prompt_tokens", 0)}


async def _drive(url: str, requests: list[dict], concurrency: int, rate: float | None) -> list[dict]:
    slots = asyncio.Semaphore(concurrency)  # FIFO: requests start in workload order
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0)) as client:
        t0 = time.monotonic()
        return await asyncio.gather(*(_one(client, url, b, slots, i / rate if rate else 0.0, t0)
                                      for i, b in enumerate(requests)))


async def _warm(url: str, replicas: int) -> set[str]:
    """Two short requests per replica through the router, sent together so that every policy spreads
    them (first-call costs out of the measured TTFTs; distinct prompts under a block, so nothing is
    cached); the replicas' URLs that answered."""
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0)) as client:
        async def one(i: int) -> str:
            r = await client.post(url + "/v1/completions", json={"model": "bench", "prompt": f"Warm up {i}.",
                                                                 "max_tokens": 2})
            r.raise_for_status()
            return r.headers.get("x-ridgeline-replica", "")
        return set(await asyncio.gather(*(one(i) for i in range(2 * replicas))))


def serve_command(model: str, engine_flags: list[str], replicas: int, policy: str) -> list[str]:
    """`ridgeline serve` with `replicas` data-parallel replicas behind its router, on a free loopback port."""
    return [sys.executable, "-m", "ridgeline.cli", "serve", model, "--host", "127.0.0.1", "--port", "0", "--quiet",
            "--served-model-name", "bench", "--data-parallel-size", str(replicas), "--router-policy", policy,
            *engine_flags]


def replica_indices(results: list[dict], warmed: set[str]) -> dict[str, int]:
    """Each replica's URL (the router's x-ridgeline-replica header) -> an index, in the order of the URLs."""
    seen = warmed | {r["replica"] for r in results if "error" not in r}
    return {u: i for i, u in enumerate(sorted(u for u in seen if u))}


def run_policy(policy: str, args, engine_flags: list[str], bodies: list[dict], tenants: list[int]) -> dict:
    from ridgeline.bench.serve import LaunchedServer

    from ridgeline.utils.api_key_env import env_with_api_key

    # no key: the server listens on loopback only, and a $RIDGELINE_API_KEY of this shell is not inherited
    cmd = serve_command(args.model, engine_flags, args.replicas, policy)
    with LaunchedServer(cmd, env=env_with_api_key(None)) as server:
        warmed = asyncio.run(_warm(server.url, args.replicas))
        results = asyncio.run(_drive(server.url, bodies, args.concurrency, args.rate))
    index = replica_indices(results, warmed)
    records = []
    for tenant, r in zip(tenants, results):
        if "error" not in r:
            r = {**r, "replica": index.get(r["replica"], -1)}
        records.append({"tenant": tenant, **r})
    return {**run_stats(policy, records, args.replicas), "records": records}


def cmd_routing(args: argparse.Namespace) -> int:
    from ridgeline.bench.routing_workload import routing_workload
    from ridgeline.models.resolve import resolve_model_source
    from ridgeline.weights.tokenizer import Tokenizer

    folder, _ = resolve_model_source(args.model, progress=False)
    tok = Tokenizer(folder)
    workload = routing_workload(tok, args.tenants, args.prefix_tokens, args.requests_per_tenant,
                                args.question_words, args.seed)
    bodies = [{"model": "bench", "messages": m, "max_tokens": args.max_tokens, "temperature": 0, "stream": True,
               "stream_options": {"include_usage": True}, "ignore_eos": True} for _, m in workload]
    longest = max(len(tok.encode_chat(m)) for _, m in workload) + args.max_tokens
    pool_tenants = args.pool_tenants if args.pool_tenants is not None else args.tenants / args.replicas + 0.5
    kv, dtype = pool_bytes(args.model, args.dtype, int(pool_tenants * longest))
    engine_flags = ["--dtype", dtype, "--kv-cache-memory", str(kv), "--max-num-batched-tokens", "512"]
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    pace = f", {args.rate:g} req/s at most" if args.rate else ""
    print(f"routing bench: {args.model} ({dtype}), {args.replicas} replicas, {len(bodies)} requests = "
          f"{args.tenants} tenants x {args.requests_per_tenant} (interleaved), prompts up to {longest} tokens, "
          f"KV pool {kv / 2**20:.1f} MiB each (~{pool_tenants:g} tenants' prompts), concurrency "
          f"{args.concurrency}{pace}", file=sys.stderr)
    runs = []
    for rep in range(args.repeats):
        for policy in policies:
            runs.append({**run_policy(policy, args, engine_flags, bodies, [t for t, _ in workload]), "repeat": rep})
            print(row(runs[-1]), file=sys.stderr, flush=True)
    report = summarize(runs, policies)
    print(report["table"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": {k: v for k, v in vars(args).items() if k != "func"}, "runs": runs,
                       "summary": report["summary"]}, f, indent=2)
    return 0
