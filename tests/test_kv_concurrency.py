"""Concurrency in KV terms (requests holding KV blocks): the most at once before the first preemption
and at it, from the engine, in /metrics, and as `ridgeline bench serve` reports it. Every request is
added before the first step (the server's steps are held until then), so the counts are exact."""
from __future__ import annotations

import threading

import httpx
import pytest
from conftest import make_tiny_model
from server_helpers import SAFETY_S, StepGate, metric, wait_until

from ridgeline import LLM, SamplingParams
from ridgeline.bench import loadgen
from ridgeline.bench.serve import format_report
from ridgeline.config import EngineConfig
from ridgeline.engine.llm_engine import LLMEngine
from ridgeline.serve.app import build_app
from ridgeline.serve.server import ServerThread
from ridgeline.serve.state import ServerSettings

GREEDY = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
PROMPTS = [[5 + i] * 48 for i in range(16)]  # 3 blocks each, 5 once decoded: the pool runs out mid-decode


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """head_dim 64, as the default model's (int8 stores 66 bytes a vector against bf16's 128)."""
    return make_tiny_model(tmp_path_factory.mktemp("wide-conc"), "llama", hidden_size=256, num_attention_heads=4,
                           num_key_value_heads=2, intermediate_size=256)


def _concurrency(model, kv_cache_dtype):
    llm = LLM(str(model), dtype="float32", kv_cache_memory="256KiB", kv_cache_dtype=kv_cache_dtype,
              max_model_len=128, progress=False)
    llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    s = llm.engine.scheduler
    assert s.num_preemptions > 0
    return s.peak_running_before_preemption, s.running_at_first_preemption, llm.info.kv_capacity_tokens


def test_int8_kv_reaches_1_8x_the_concurrency_of_bf16_before_the_first_preemption(wide):
    bf16, int8 = _concurrency(wide, "bfloat16"), _concurrency(wide, "int8")
    assert (bf16[2], int8[2]) == (256, 496)  # 16 vs 31 blocks of 16 tokens in the same 256 KiB
    # admission keeps one block free (the watermark): 5 and 10 prompts of 3 blocks fit
    assert bf16[:2] == (5, 5) and int8[:2] == (10, 10)
    assert int8[0] / bf16[0] >= 1.8


@pytest.fixture(scope="module")
def engine(tiny_llama):
    # 512 B a token (float32, 2 layers, 2 KV heads of 16): 24 blocks of 16 tokens
    return LLMEngine(EngineConfig.from_kwargs(str(tiny_llama), progress=False, dtype="float32",
                                              kv_cache_memory="192KiB", max_num_batched_tokens=512))


def test_metrics_and_bench_report_the_concurrency_at_the_first_preemption(engine):
    app = build_app(engine, ServerSettings("tiny"))
    with ServerThread(app) as srv, StepGate(srv.app) as gate:
        url = srv.url
        before = loadgen.parse_prometheus(httpx.get(url + "/metrics").text)
        assert metric(url, "ridgeline_num_requests_running_at_first_preemption") == 0
        body = {"model": "tiny", "max_tokens": 32, "temperature": 0, "ignore_eos": True}
        done: list[int] = []
        threads = [threading.Thread(target=lambda p=p: done.append(httpx.post(
            url + "/v1/completions", json={**body, "prompt": p}, timeout=SAFETY_S).status_code)) for p in PROMPTS[:10]]
        for t in threads:
            t.start()
        wait_until(lambda: metric(url, "ridgeline_num_requests_waiting") == 10, "all ten accepted")
        gate.open()
        for t in threads:
            t.join(SAFETY_S)
        assert done == [200] * 10
        after = loadgen.parse_prometheus(httpx.get(url + "/metrics").text)
    c = loadgen.preemption_concurrency(before, after)
    assert c["preemptions"] > 0 and c["first_preemption_in_run"] and not c["preempted_before_run"]
    # 23 usable blocks, one kept free at admission: 7 prompts of 3 blocks, all preempted-for at once
    assert (c["max_running_before_first_preemption"], c["running_at_first_preemption"]) == (7, 7)
    assert c["max_running_since_start"] >= 7
    (line,) = [x for x in format_report(_summary(), {**_META, "kv_concurrency": c}).splitlines()
               if x.startswith("Concurrency before first preemption (server):")]
    assert line.endswith(" 7 requests holding KV at most (7 at the preemption)")


def test_bench_concurrency_without_a_preemption_or_with_one_before_the_run():
    gauges = "ridgeline_num_requests_running_max 3\nridgeline_num_requests_running_max_before_preemption 3\n" \
             "ridgeline_num_requests_running_at_first_preemption {}\nridgeline_num_preemptions_total {}\n"
    none = loadgen.parse_prometheus(gauges.format(0, 0))
    c = loadgen.preemption_concurrency(none, none)
    assert c == {"preemptions": 0, "first_preemption_in_run": False, "preempted_before_run": False,
                 "max_running_before_first_preemption": None, "running_at_first_preemption": None,
                 "max_running_since_start": 3}
    assert "Concurrency, no preemption (server):" in format_report(_summary(), {**_META, "kv_concurrency": c})
    early = loadgen.parse_prometheus(gauges.format(2, 1))
    c = loadgen.preemption_concurrency(early, early)
    assert c["preempted_before_run"] and c["max_running_before_first_preemption"] is None
    assert "the server preempted before the run" in format_report(_summary(), {**_META, "kv_concurrency": c})
    vllm = loadgen.parse_prometheus("vllm:num_preemptions_total 0\n")  # other servers have no such gauges
    assert loadgen.preemption_concurrency(vllm, vllm) is None


_META = {"server_desc": "s", "model": "m", "workload_desc": "w", "load_desc": "l"}


def _summary() -> dict:
    return loadgen.summarize([], 1.0, {})
