"""`ridgeline bench routing`'s parts that need no replicas: the multi-tenant workload, the KV pool
sizing, the server it starts (a `ridgeline serve --data-parallel-size N` command line the CLI accepts),
replica numbering, per-run numbers from request records, and the report with its target verdicts."""
from __future__ import annotations

from ridgeline.bench.routing import pool_bytes, replica_indices, serve_command
from ridgeline.bench.routing_report import run_stats, summarize
from ridgeline.bench.routing_workload import routing_workload
from ridgeline.weights.tokenizer import Tokenizer


def test_workload_interleaves_tenants_with_shared_prompts(tiny_llama):
    tok = Tokenizer(tiny_llama)
    w = routing_workload(tok, tenants=4, prefix_tokens=200, per_tenant=3, question_words=5, seed=1)
    assert len(w) == 12
    for r in range(3):  # each round has every tenant once
        assert sorted(t for t, _ in w[4 * r:4 * r + 4]) == [0, 1, 2, 3]
    systems = {t: m[0]["content"] for t, m in w}
    assert all(m[0]["content"] == systems[t] for t, m in w), "a tenant's requests share its system prompt"
    assert len(set(systems.values())) == 4 and len({m[1]["content"] for _, m in w}) == 12
    assert all(180 <= len(tok.encode(s, add_special_tokens=False)) <= 200 for s in systems.values())
    assert w == routing_workload(tok, 4, 200, 3, 5, seed=1)


def test_pool_bytes_counts_blocks_of_the_models_kv(tiny_llama):
    # tiny llama: 2 layers x 2 KV heads x head_dim 16, K and V, float32 -> 512 B per token
    kv, dtype = pool_bytes(str(tiny_llama), "float32", 100)
    assert dtype == "float32" and kv == 7 * 16 * 512


def test_the_started_server_is_a_data_parallel_serve_on_loopback():
    from ridgeline.cli import build_parser
    cmd = serve_command("m", ["--dtype", "float32", "--kv-cache-memory", "4096"], 3, "least-load")
    assert cmd[1:4] == ["-m", "ridgeline.cli", "serve"]
    args = build_parser().parse_args(cmd[3:])
    assert (args.model_positional, args.host, args.port, args.data_parallel_size, args.router_policy) == \
        ("m", "127.0.0.1", 0, 3, "least-load")
    assert (args.dtype, args.kv_cache_memory, args.served_model_name, args.api_key) == \
        ("float32", "4096", "bench", None)


def test_replicas_are_numbered_by_url_whatever_answered_first():
    a, b = "http://127.0.0.1:4001", "http://127.0.0.1:3999"
    results = [{"replica": a}, {"error": "HTTP 500"}, {"replica": a}]
    assert replica_indices(results, {b, a}) == {b: 0, a: 1}
    assert replica_indices([{"replica": b}], {""}) == {b: 0}  # a reply without the header names none


def _records(replicas_of_tenant: dict[int, list[int]], cached: int, predicted: int) -> list[dict]:
    return [{"tenant": t, "replica": r, "cached": cached, "predicted": predicted, "prompt_tokens": 100,
             "ttft": 1.0, "e2e": 2.0} for t, rs in replicas_of_tenant.items() for r in rs]


def test_run_stats_from_request_records():
    s = run_stats("cache-aware", _records({0: [0, 0, 0, 1], 1: [1, 1, 1, 1]}, 50, 48)
                  + [{"tenant": 1, "error": "HTTP 500"}], 2)
    assert s["requests"] == 9 and s["errors"] == 1 and s["first_error"] == "HTTP 500"
    assert s["hit_rate"] == 0.5 and s["share"] == [3 / 8, 5 / 8]
    assert s["home"] == 7 / 8 and s["mispredicted"] == 8 and s["mean_ttft_s"] == 1.0


def test_summary_ratios_shares_and_targets():
    runs = [{"policy": "round-robin", "hit_rate": 0.2, "mean_ttft_s": 3.0, "p90_ttft_s": 5.0, "mean_e2e_s": 4.0,
             "share": [0.5, 0.5], "errors": 0, "home": 0.5, "mispredicted": 3},
            {"policy": "cache-aware", "hit_rate": 0.5, "mean_ttft_s": 1.0, "p90_ttft_s": 2.0, "mean_e2e_s": 2.0,
             "share": [0.7, 0.3], "errors": 0, "home": 1.0, "mispredicted": 0}]
    s = summarize(runs, ["round-robin", "cache-aware"])
    assert s["summary"]["hit_rate_gain"] == 2.5 and s["summary"]["ttft_speedup"] == 3.0
    assert s["summary"]["max_share_cache_aware"] == 0.7
    assert s["summary"]["targets_met"] == {"hit_rate_gain": True, "ttft_speedup": True, "max_share": False}
    assert "| cache-aware | 50.0% | 1.000 | 2.000 | 2.000 | 70% / 30% | 100% | 0 | 0 |" in s["table"]
    assert "prefix hit rate x2.50  (target >= x1.6: met)" in s["table"]
    assert "busiest replica 70% of the requests  (target <= 65%: NOT met)" in s["table"]
