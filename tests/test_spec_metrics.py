"""Speculation metrics: per request (RequestOutput.speculative, the server's usage.speculative), per
engine, and on /metrics; they add up."""
from __future__ import annotations

import httpx
import openai
from server_helpers import metric

from ridgeline import LLM, SamplingParams
from ridgeline.config import EngineConfig
from ridgeline.engine.llm_engine import LLMEngine
from ridgeline.serve.app import build_app
from ridgeline.serve.server import ServerThread
from ridgeline.serve.state import ServerSettings
from ridgeline.engine.spec_stats import SpecStats

OPTS = dict(dtype="float32", kv_cache_memory="2MiB", progress=False, speculative_method="ngram",
            num_speculative_tokens=3, ngram_min=1, speculative_controller="off")
PROMPTS = ["abc abc abc abc abc abc", "one two one two one two one two", "xyz xyz"]


def test_per_request_stats_add_up_to_the_engines(tiny_llama):
    llm = LLM(str(tiny_llama), **OPTS)
    params = [SamplingParams(temperature=0, max_tokens=40, ignore_eos=True),
              SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, n=2),
              SamplingParams(temperature=0.8, max_tokens=20, ignore_eos=True, seed=1)]
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    total = SpecStats()
    for o in outs:
        assert o.speculative is not None
        total.add(o.speculative)
        s = o.speculative.summary()
        assert s["accepted_tokens"] <= s["drafted_tokens"] and len(s["acceptance_by_position"]) <= 3
        assert s["draft_time_s"] >= 0
        emitted = sum(len(c.token_ids) for c in o.outputs)
        # every verification step emits its accepted drafts and one more token; the rest come one per step
        assert o.speculative.accepted + o.speculative.steps <= emitted
    eng = llm.engine.spec_stats
    assert (total.proposed, total.accepted, total.steps) == (eng.proposed, eng.accepted, eng.steps)
    assert total.accepted_at == eng.accepted_at and total.proposed_at == eng.proposed_at
    assert eng.proposed > 0 and eng.accepted > 0
    assert abs(total.draft_time - eng.draft_time) < 1e-6
    s = eng.summary()
    assert s["mean_accepted_length"] == round(1 + eng.accepted / eng.steps, 4)
    assert s["acceptance_by_position"][0] == round(eng.accepted_at[0] / eng.proposed_at[0], 4)


def test_no_speculative_field_without_speculation(tiny_llama):
    llm = LLM(str(tiny_llama), dtype="float32", kv_cache_memory="2MiB", progress=False)
    out = llm.generate(PROMPTS[:1], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)[0]
    assert out.speculative is None


def test_server_reports_usage_and_prometheus_counters(tiny_llama):
    engine = LLMEngine(EngineConfig.from_kwargs(str(tiny_llama), **OPTS))
    with ServerThread(build_app(engine, ServerSettings("tiny", max_waiting=8))) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        r = client.completions.create(model="tiny", prompt=PROMPTS[0], temperature=0, max_tokens=32,
                                      extra_body={"ignore_eos": True})
        spec = r.usage.model_extra["speculative"]
        assert spec["drafted_tokens"] > 0 and spec["accepted_tokens"] > 0
        assert spec["verify_steps"] > 0 and spec["mean_accepted_length"] > 1
        drafted = metric(server.url, "ridgeline_spec_decode_draft_tokens_total")
        accepted = metric(server.url, "ridgeline_spec_decode_accepted_tokens_total")
        assert (drafted, accepted) == (spec["drafted_tokens"], spec["accepted_tokens"])
        assert metric(server.url, "ridgeline_spec_decode_verify_steps_total") == spec["verify_steps"]
        assert metric(server.url, "ridgeline_spec_decode_drafted_by_position_total", 'position="0"') == \
            spec["verify_steps"]
        assert metric(server.url, "ridgeline_spec_decode_accepted_by_position_total", 'position="0"') > 0
        assert "ridgeline_spec_decode_draft_seconds_total" in httpx.get(server.url + "/metrics").text
