"""`ridgeline bench serve`: the load generator's statistics, and whole runs against a tiny `ridgeline serve`
on loopback (one it starts itself, one started here and given by --url). No timing asserts."""
from __future__ import annotations

import json
import math
import statistics
import sys

import pytest

from ridgeline.bench import loadgen
from ridgeline.bench.loadgen import RequestResult
from ridgeline.bench.serve import LaunchedServer, engine_cli_args
from ridgeline.bench.workloads import chat_workload, make_workload
from ridgeline.cli import main
from ridgeline.weights.tokenizer import Tokenizer

ENGINE = ["--dtype", "float32", "--kv-cache-memory", "16MiB", "--max-num-batched-tokens", "256"]
PROMPTS = ["--min-prompt", "60", "--max-prompt", "150"]


def _load(path):
    return json.loads(path.read_text())


# ---------------------------------------------------------------- no server

def test_percentile_interpolates_like_numpy():
    xs = [4.0, 1.0, 3.0, 2.0]
    assert loadgen.percentile(xs, 50) == 2.5
    assert math.isclose(loadgen.percentile(xs, 90), 3.7)
    assert loadgen.percentile(xs, 0) == 1.0 and loadgen.percentile(xs, 100) == 4.0
    assert loadgen.percentile([7.0], 99) == 7.0 and math.isnan(loadgen.percentile([], 50))


def test_summarize_tpot_throughput_and_goodput():
    a = RequestResult(0, ok=True, prompt_tokens=10, output_tokens=5, ttft=0.2, e2e=1.0, itl=[0.2] * 4)
    b = RequestResult(1, ok=True, prompt_tokens=20, output_tokens=5, ttft=2.0, e2e=2.4, itl=[0.1] * 4)
    c = RequestResult(2, error="HTTP 400: too long", prompt_tokens=30)
    assert math.isclose(a.tpot, 0.2) and math.isclose(b.tpot, 0.1) and c.tpot is None
    s = loadgen.summarize([a, b, c], duration=4.0, slo={"ttft": 1.0, "tpot": None})
    assert (s["completed"], s["failed"], s["prompt_tokens"], s["output_tokens"]) == (2, 1, 30, 10)
    assert math.isclose(s["request_throughput"], 0.5) and math.isclose(s["output_throughput"], 2.5)
    assert math.isclose(s["total_token_throughput"], 10.0)
    assert s["slo"] == {"ttft": 1.0} and s["good_requests"] == 1 and math.isclose(s["goodput"], 0.25)
    assert s["itl_s"]["count"] == 8 and math.isclose(s["itl_s"]["mean"], 0.15)
    assert s["errors"] == [{"error": "HTTP 400: too long", "count": 1}]
    assert loadgen.summarize([a], 1.0)["goodput"] is None  # no SLO given, no goodput
    assert loadgen.summarize([a, b], 1.0, {"tpot": 0.15})["good_requests"] == 1


def test_poisson_arrivals_are_seeded():
    t = loadgen.arrival_times(2000, 4.0, seed=1)
    assert t == loadgen.arrival_times(2000, 4.0, seed=1) != loadgen.arrival_times(2000, 4.0, seed=2)
    assert t[0] == 0 and all(x <= y for x, y in zip(t, t[1:]))
    assert 0.22 < statistics.mean(y - x for x, y in zip(t, t[1:])) < 0.28
    assert loadgen.arrival_times(3, math.inf, seed=1) == [0.0] * 3


def test_prefix_cache_rate_from_prometheus_text():
    def page(q, h):
        return (f"# HELP ridgeline_prefix_cache_queries_total x\n# TYPE ridgeline_prefix_cache_queries_total counter\n"
                f"ridgeline_prefix_cache_queries_total {q}\nridgeline_prefix_cache_hits_total {h}\n"
                f'ridgeline_requests_total{{status="length"}} 3.0\nridgeline_requests_total{{status="stop"}} 2.0\n')
    before, after = loadgen.parse_prometheus(page(100, 10)), loadgen.parse_prometheus(page(300, 110))
    assert before["ridgeline_requests_total"] == 5.0  # summed over labels
    assert loadgen.prefix_cache_delta(before, after) == {"queries": 200, "hits": 100, "hit_rate": 0.5}
    vllm = loadgen.parse_prometheus('vllm:prefix_cache_queries_total{model_name="m"} 50\n'
                                    'vllm:prefix_cache_hits_total{model_name="m"} 5\n')
    assert loadgen.prefix_cache_delta({"vllm:prefix_cache_queries_total": 0, "vllm:prefix_cache_hits_total": 0},
                                      vllm)["hit_rate"] == 0.1
    assert loadgen.prefix_cache_delta(loadgen.parse_prometheus("llamacpp:tokens_predicted_total 4\n"),
                                      loadgen.parse_prometheus("llamacpp:tokens_predicted_total 9\n")) is None
    assert loadgen.prefix_cache_delta(None, after) is None


def test_started_server_gets_only_the_engine_options_given():
    import argparse

    from ridgeline.cli import add_engine_args
    p = argparse.ArgumentParser()
    add_engine_args(p)
    args = p.parse_args(["--model", "m", "--dtype", "float32", "--no-prefix-caching", "--max-num-seqs", "8"])
    assert engine_cli_args(args) == ["--model", "m", "--dtype", "float32", "--no-prefix-caching",
                                     "--max-num-seqs", "8"]


# ---------------------------------------------------------------- against a server

@pytest.fixture(scope="module")
def tok(tiny_llama):
    return Tokenizer(tiny_llama)


def _check_consistent(r: dict, n: int, output_len: int) -> None:
    s = r["summary"]
    assert (s["completed"], s["failed"], s["errors"]) == (n, 0, [])
    assert s["output_tokens"] == n * output_len
    assert len(r["requests"]) == n
    for q in r["requests"]:
        assert q["ok"] and q["output_tokens"] == output_len
        assert 0 < q["ttft"] <= q["e2e"] and q["tpot"] >= 0
        assert math.isclose(q["tpot"], (q["e2e"] - q["ttft"]) / (output_len - 1))
    for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s"):
        d = s[key]
        if key == "itl_s" and not d.get("count"):
            continue  # a fast server can deliver a short stream's tokens in one chunk: no gaps to time
        assert 0 <= d["p50"] <= d["p90"] <= d["p99"] <= d["max"], (key, d)
        assert d["mean"] <= d["max"]
    assert s["ttft_s"]["count"] == s["e2e_s"]["count"] == n
    assert s["ttft_s"]["p50"] <= s["e2e_s"]["p50"] and s["duration_s"] >= s["e2e_s"]["max"]
    dur = s["duration_s"]
    assert math.isclose(s["request_throughput"], n / dur)
    assert math.isclose(s["output_throughput"], s["output_tokens"] / dur)
    assert math.isclose(s["total_token_throughput"], (s["prompt_tokens"] + s["output_tokens"]) / dur)


def test_bench_serve_starts_its_own_server(tiny_llama, tok, tmp_path, capsys):
    out, png = tmp_path / "s.json", tmp_path / "latency.png"
    rc = main(["bench", "serve", "--model", str(tiny_llama), *ENGINE, *PROMPTS, "--num-requests", "6",
               "--concurrency", "3", "--output-len", "8", "--slo-ttft", "60", "--slo-tpot", "10",
               "--no-progress", "--json", str(out), "--plot", str(png)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "Successful requests:" in printed and "Goodput" in printed and "TTFT" in printed
    r = _load(out)
    _check_consistent(r, 6, 8)
    prompts = chat_workload(tok, 6, 60, 150, seed=0)
    s = r["summary"]
    assert s["prompt_tokens"] == r["workload"]["prompt_tokens"] == sum(map(len, prompts))
    assert [q["prompt_tokens"] for q in r["requests"]] == [len(p) for p in prompts]
    assert s["output_tokens_from_usage"] == 6
    assert s["good_requests"] == 6 and math.isclose(s["goodput"], s["request_throughput"])
    assert r["server"]["started_by_bench"] and r["model"] == str(tiny_llama)
    assert r["load"] == {**r["load"], "concurrency": 3, "arrivals": "all at once"}
    pc = r["prefix_cache"]  # the scrape worked: the tokens looked up are the prompts sent
    assert pc is not None and pc["queries"] == s["prompt_tokens"] and 0 <= pc["hit_rate"] <= 1
    conc = r["kv_concurrency"]  # the server's requests holding KV blocks (the warm-up's included)
    assert conc is not None and 1 <= conc["max_running_since_start"] <= 3
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


@pytest.fixture(scope="module")
def server(tiny_llama):
    cmd = [sys.executable, "-m", "ridgeline.cli", "serve", "--port", "0", "--model", str(tiny_llama), *ENGINE,
           "--served-model-name", "tiny"]
    with LaunchedServer(cmd, startup_timeout=300, echo=None) as s:
        yield s


def _bench(server, tiny_llama, tmp_path, *extra) -> tuple[int, dict]:
    out = tmp_path / "r.json"
    rc = main(["bench", "serve", "--url", server.url, "--tokenizer", str(tiny_llama), "--num-warmup", "0",
               "--no-progress", "--json", str(out), *extra])
    return rc, _load(out)


@pytest.mark.parametrize("fmt", ["text", "chat"])
def test_bench_serve_url_poisson_text_and_chat(server, tiny_llama, tmp_path, fmt):
    rc, r = _bench(server, tiny_llama, tmp_path, *PROMPTS, "--num-requests", "5", "--request-rate", "50",
                   "--output-len", "6", "--prompt-format", fmt, "--seed", "3")
    assert rc == 0 and r["model"] == "tiny"  # the name the server lists
    _check_consistent(r, 5, 6)
    schedule = loadgen.arrival_times(5, 50.0, seed=r["workload"]["seed"])
    sent = [q["sent"] for q in sorted(r["requests"], key=lambda q: q["index"])]
    assert all(s >= t - 1e-3 for s, t in zip(sent, schedule))  # none before its Poisson arrival time
    assert r["load"]["arrivals"] == "poisson" and r["workload"]["prompt_format"] == fmt
    # the server's token count (usage) of the text / messages is the workload's token ids
    assert r["summary"]["prompt_tokens"] == r["workload"]["prompt_tokens"]


def test_bench_serve_shared_prefix_hits_the_prefix_cache(server, tiny_llama, tok, tmp_path, capsys):
    rc, r = _bench(server, tiny_llama, tmp_path, "--workload", "shared-prefix", "--prefix-len", "200",
                   "--num-requests", "6", "--concurrency", "1", "--output-len", "4", "--workload-seed", "5")
    assert rc == 0
    _check_consistent(r, 6, 4)
    prompts = make_workload("shared-prefix", tok, 6, prefix_len=200, seed=5)
    assert r["summary"]["prompt_tokens"] == sum(map(len, prompts))
    assert r["prefix_cache"]["hit_rate"] > 0.3  # requests 2..6 reuse the common system prompt
    assert "Prefix cache hit rate" in capsys.readouterr().out


def test_bench_serve_counts_chunks_without_usage(server, tiny_llama, tmp_path):
    rc, r = _bench(server, tiny_llama, tmp_path, *PROMPTS, "--num-requests", "3", "--output-len", "5",
                   "--no-stream-usage")
    assert rc == 0 and r["summary"]["completed"] == 3 and r["summary"]["output_tokens_from_usage"] == 0
    for q in r["requests"]:  # a chunk carries one or more tokens (held-back UTF-8 bytes, skipped specials)
        assert q["output_tokens_source"] == "chunks" and 0 <= q["output_tokens"] == q["text_chunks"] <= 5


def test_bench_serve_reports_failed_requests(server, tiny_llama, tmp_path):
    rc, r = _bench(server, tiny_llama, tmp_path, *PROMPTS, "--num-requests", "3", "--output-len", "1000")
    s = r["summary"]  # prompt + 1000 tokens is over the tiny model's 512: every request is a 400
    assert rc == 1 and (s["completed"], s["failed"]) == (0, 3)
    (err,) = s["errors"]  # one kind of failure, whatever the prompt lengths in its message
    assert err["count"] == 3 and err["error"].startswith("HTTP 400") and "maximum context length" in err["error"]
    assert s["ttft_s"]["p50"] is None  # NaN written as null
