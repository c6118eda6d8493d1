"""Prefix caching end to end on the tiny model: lossless (greedy output identical with the cache on and
off, under evictions and preemptions), cached_tokens per request and in the API, salts, metrics."""
from __future__ import annotations

import argparse
import json

import httpx
import pytest

from conftest import make_tiny_model
from ridgeline import LLM, SamplingParams
from ridgeline.bench.workloads import multi_turn_workload, shared_prefix_workload
from ridgeline.cli import add_engine_args, engine_kwargs
from ridgeline.config import EngineConfig
from ridgeline.engine.llm_engine import LLMEngine
from ridgeline.serve.app import build_app
from ridgeline.serve.server import ServerThread
from ridgeline.serve.state import ServerSettings


@pytest.fixture(scope="module")
def tiny_1k(tmp_path_factory):
    """The conftest tiny llama with room for 8-turn conversations (byte tokens: 1 per character)."""
    return make_tiny_model(tmp_path_factory.mktemp("tiny-llama-1k"), "llama", max_position_embeddings=1024)


def _run(model, prompts, caching: bool, kv: str, max_tokens: int):
    llm = LLM(str(model), dtype="float32", kv_cache_memory=kv, max_num_batched_tokens=256,
              enable_prefix_caching=caching, progress=False)
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True),
                        use_tqdm=False)
    eng = llm.engine
    eng.kv.check_integrity()
    assert eng.kv.num_used_blocks == 0 and eng.kv.caching == caching
    return [o.outputs[0].token_ids for o in outs], outs, eng


@pytest.mark.parametrize("workload", ["shared-prefix", "multi-turn"])
def test_greedy_output_identical_with_cache_on_and_off(tiny_1k, workload):
    from ridgeline.weights.tokenizer import Tokenizer
    tok = Tokenizer(tiny_1k)
    if workload == "shared-prefix":  # ~380-token prompts, 320 shared; 640-token pool
        prompts, kv, max_tokens = shared_prefix_workload(tok, 10, prefix_len=250), "320KiB", 16
    else:  # 3 conversations x 8 turns, up to ~750 tokens; 768-token pool
        prompts, kv, max_tokens = multi_turn_workload(tok, 24, concurrent=3, reply_words=(1, 3)), "384KiB", 24
    off, _, eng_off = _run(tiny_1k, prompts, False, kv, max_tokens)
    on, outs, eng_on = _run(tiny_1k, prompts, True, kv, max_tokens)
    assert on == off
    stats = eng_on.kv.stats
    assert eng_off.scheduler.num_preemptions > 0 and eng_on.scheduler.num_preemptions > 0
    assert stats.evictions > 0 and 0 < stats.hits < stats.queries
    cached = [o.num_cached_tokens for o in outs]
    assert cached[0] == 0 and sum(cached) > 0 and all(c % 16 == 0 for c in cached)
    assert all(c < len(p) for c, p in zip(cached, prompts))


@pytest.fixture(scope="module")
def engine(tiny_llama):
    return LLMEngine(EngineConfig.from_kwargs(str(tiny_llama), dtype="float32", kv_cache_memory="2MiB",
                                              progress=False))


def _generate(eng: LLMEngine, rid: str, prompt: str, salt: str | None = None, n: int = 1):
    eng.add_request(rid, prompt, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, n=n), cache_salt=salt)
    while eng.has_unfinished():
        for out in eng.step(emit_unfinished=False):
            if out.request_id == rid:
                result = out
    eng.kv.check_integrity()
    return result


def test_cached_tokens_per_request_and_salt_isolation(engine):
    assert engine.config.cache.enable_prefix_caching and engine.info.prefix_caching
    prompt = "The same long system prompt, sent again and again by every request. " * 2  # 140 tokens
    first = _generate(engine, "a", prompt)
    again = _generate(engine, "b", prompt)
    assert first.num_cached_tokens == 0 and again.num_cached_tokens == 128  # (140 - 1) // 16 blocks
    assert again.outputs[0].token_ids == first.outputs[0].token_ids
    assert _generate(engine, "c", prompt, salt="tenant-1").num_cached_tokens == 0
    assert _generate(engine, "d", prompt, salt="tenant-1").num_cached_tokens == 128
    assert _generate(engine, "e", prompt, salt="tenant-2").num_cached_tokens == 0
    with pytest.raises(Exception, match="cache_salt"):
        _generate(engine, "f", prompt, salt="")


def test_n_choices_reuse_the_prompt_through_the_cache(engine):
    prompt = "abcdefghijklmnopqrstuvwxyz" * 3  # 78 tokens, unseen: choice 0 computes them, the others hit
    hits = engine.kv.stats.hits
    out = _generate(engine, "n3", prompt, n=3)
    assert len({tuple(c.token_ids) for c in out.outputs}) == 1 and out.num_cached_tokens == 0
    assert engine.kv.stats.hits - hits == 2 * 64
    assert engine.kv.num_used_blocks == 0


def test_cache_can_be_turned_off(tiny_llama):
    llm = LLM(str(tiny_llama), dtype="float32", kv_cache_memory="1MiB", enable_prefix_caching=False, progress=False)
    assert not llm.engine.kv.caching and "prefix caching off" in llm.info.summary()
    p = argparse.ArgumentParser()
    add_engine_args(p)
    assert engine_kwargs(p.parse_args([]))["enable_prefix_caching"] is True
    assert engine_kwargs(p.parse_args(["--no-prefix-caching"]))["enable_prefix_caching"] is False


def _metric(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} missing from /metrics")


def test_server_usage_metrics_salt_and_request_log(tiny_llama, tmp_path):
    log = tmp_path / "requests.jsonl"
    engine = LLMEngine(EngineConfig.from_kwargs(str(tiny_llama), dtype="float32", kv_cache_memory="2MiB",
                                                progress=False))
    with ServerThread(build_app(engine, ServerSettings("tiny", log_requests=str(log)))) as srv:
        system = "You are the support bot of a bicycle shop. Answer briefly and politely. " * 2
        body = {"model": "tiny", "max_tokens": 3, "temperature": 0,
                "messages": [{"role": "system", "content": system}, {"role": "user", "content": "hi"}]}
        usage = [httpx.post(srv.url + "/v1/chat/completions", json=body).json()["usage"] for _ in range(2)]
        salted = httpx.post(srv.url + "/v1/chat/completions", json={**body, "cache_salt": "t1"}).json()["usage"]
        r = httpx.post(srv.url + "/v1/completions", json={"model": "tiny", "prompt": system, "max_tokens": 2})
        assert r.status_code == 200
        assert usage[0]["prompt_tokens_details"]["cached_tokens"] == 0
        assert usage[1]["prompt_tokens_details"]["cached_tokens"] == (usage[1]["prompt_tokens"] - 1) // 16 * 16
        assert salted["prompt_tokens_details"]["cached_tokens"] == 0
        queries, hits = _metric(srv.url, "ridgeline_prefix_cache_queries_total"), \
            _metric(srv.url, "ridgeline_prefix_cache_hits_total")
        assert queries >= 3 * usage[0]["prompt_tokens"] and hits >= usage[1]["prompt_tokens_details"]["cached_tokens"]
        assert _metric(srv.url, "ridgeline_kv_cache_blocks_used") == 0
        cached = _metric(srv.url, "ridgeline_kv_cache_blocks_cached")
        free = _metric(srv.url, "ridgeline_kv_cache_blocks_free")
        assert cached > 0 and cached + free == _metric(srv.url, "ridgeline_kv_cache_blocks_total")
        assert _metric(srv.url, "ridgeline_prefix_cache_evictions_total") == 0
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert len(lines) == 4 and lines[0] == body and lines[2]["cache_salt"] == "t1" and lines[3]["prompt"] == system


def test_multi_turn_workload_resends_the_history(tiny_llama):
    from ridgeline.bench.workloads import make_workload
    from ridgeline.weights.tokenizer import Tokenizer
    tok = Tokenizer(tiny_llama)
    prompts = multi_turn_workload(tok, 20, turns=4, concurrent=2, reply_words=(2, 4), seed=1)
    assert prompts[:6] == multi_turn_workload(tok, 6, turns=4, concurrent=2, reply_words=(2, 4), seed=1)
    for conv in range(2):  # requests are interleaved: turn t of conversation c is request 2 * t + c
        turns = prompts[conv:8:2]
        assert all(a == b[:len(a)] and len(b) > len(a) for a, b in zip(turns, turns[1:]))
    assert prompts[0][:len(prompts[1])] != prompts[1]  # different conversations differ
    assert make_workload("multi-turn", tok, 3) == multi_turn_workload(tok, 3)
