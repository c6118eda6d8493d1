"""The OpenAI-compatible server on the tiny model, through the official `openai` client (sync and
async, streaming and not), against the offline engine; disconnects free KV blocks."""
from __future__ import annotations

import asyncio
import logging
import threading
import time

import httpx
import openai
import pytest

from ridgeline import LLM, SamplingParams
from ridgeline.config import EngineConfig
from ridgeline.engine.llm_engine import LLMEngine
from ridgeline.serve.app import build_app
from ridgeline.serve.server import ServerThread
from ridgeline.serve.state import ServerSettings

OPTS = dict(dtype="float32", kv_cache_memory="2MiB", max_num_batched_tokens=256)
MODEL = "tiny"


@pytest.fixture(scope="module")
def server(tiny_llama):
    engine = LLMEngine(EngineConfig.from_kwargs(str(tiny_llama), progress=False, **OPTS))
    with ServerThread(build_app(engine, ServerSettings(MODEL, max_waiting=64))) as s:
        yield s


@pytest.fixture(scope="module")
def offline(tiny_llama):
    return LLM(str(tiny_llama), progress=False, **OPTS)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def metric(url: str, name: str, labels: str = "") -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(name + (labels and "{" + labels + "}") + " "):
            return float(line.split()[-1])
    return 0.0


def wait_idle(url: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while metric(url, "ridgeline_kv_cache_blocks_used") or metric(url, "ridgeline_num_requests_running"):
        assert time.monotonic() < deadline, "KV blocks were not freed"
        time.sleep(0.05)


def test_models_health_and_metrics(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    assert metric(server.url, "ridgeline_kv_cache_blocks_total") == 256


def test_chat_matches_offline_and_reports_usage(client, offline):
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    r = client.chat.completions.create(model=MODEL, messages=msgs, temperature=0, max_tokens=12)
    ref = offline.chat([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
                       SamplingParams(temperature=0, max_tokens=12), use_tqdm=False)[0]
    c = r.choices[0]
    assert r.object == "chat.completion" and c.message.role == "assistant"
    assert c.message.content == ref.outputs[0].text
    assert c.finish_reason == ("length" if len(ref.outputs[0].token_ids) == 12 else "stop")
    assert r.usage.prompt_tokens == len(ref.prompt_token_ids)
    assert r.usage.completion_tokens == len(ref.outputs[0].token_ids)
    assert r.usage.prompt_tokens_details.cached_tokens == 0


def test_chat_stream_equals_non_stream_and_ends_with_usage(client):
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "tell me"}], temperature=0, max_tokens=16,
              extra_body={"ignore_eos": True})
    full = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == \
        full.choices[0].message.content
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 16
    assert all(ch.usage is None for ch in chunks[:-1])


def test_completions_n2_seed_and_echo(client, offline):
    kw = dict(model=MODEL, prompt="Once upon a time", n=2, temperature=1.0, seed=7, max_tokens=10,
              extra_body={"ignore_eos": True})
    a, b = client.completions.create(**kw), client.completions.create(**kw)
    assert [c.index for c in a.choices] == [0, 1]
    assert [c.text for c in a.choices] == [c.text for c in b.choices]
    assert a.choices[0].text != a.choices[1].text
    assert a.usage.completion_tokens == 20 and a.usage.prompt_tokens == len("Once upon a time")
    ids = [offline.tokenizer.encode("Hi"), offline.tokenizer.encode("yo")]
    echo = client.completions.create(model=MODEL, prompt=ids, echo=True, max_tokens=3, temperature=0)
    assert [c.index for c in echo.choices] == [0, 1]
    assert echo.choices[0].text.startswith("Hi") and echo.choices[1].text.startswith("yo")


def test_stop_strings_and_stop_token_ids(client):
    kw = dict(model=MODEL, prompt="The meaning of life is", temperature=0, max_tokens=30,
              extra_body={"ignore_eos": True})
    base = client.completions.create(**kw).choices[0].text
    stop = base[4:7]
    r = client.completions.create(stop=[stop], **kw).choices[0]
    assert r.text == base[:base.index(stop)] and r.finish_reason == "stop"
    s = list(client.completions.create(stop=stop, stream=True, **kw))
    assert "".join(ch.choices[0].text for ch in s) == r.text and s[-1].choices[0].finish_reason == "stop"


def test_logprobs_chat_and_completions(client):
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], temperature=0,
                                       max_tokens=5, logprobs=True, top_logprobs=3, extra_body={"ignore_eos": True})
    content = r.choices[0].logprobs.content
    assert len(content) == 5 and all(len(t.top_logprobs) == 3 for t in content)
    assert all(t.logprob == pytest.approx(t.top_logprobs[0].logprob) and t.logprob <= 0 for t in content)
    c = client.completions.create(model=MODEL, prompt="abc", temperature=0, max_tokens=4, logprobs=2,
                                  extra_body={"ignore_eos": True}).choices[0].logprobs
    assert len(c.tokens) == len(c.token_logprobs) == len(c.top_logprobs) == 4
    assert c.text_offset[0] == 0 and all(len(t) <= 2 for t in c.top_logprobs)


def test_32_concurrent_streams_match_offline_greedy(server, offline):
    prompts = [f"request {i}: " + "abcdefghij"[: i % 10] for i in range(32)]
    ref = offline.generate(prompts, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True), use_tqdm=False)

    async def one(aclient, prompt):
        text, finish = "", None
        async for ch in await aclient.completions.create(model=MODEL, prompt=prompt, temperature=0, max_tokens=24,
                                                         stream=True, extra_body={"ignore_eos": True}):
            text += ch.choices[0].text
            finish = ch.choices[0].finish_reason or finish
        return text, finish

    async def main():
        async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0) as aclient:
            return await asyncio.gather(*(one(aclient, p) for p in prompts))

    got = asyncio.run(main())
    assert [t for t, _ in got] == [o.outputs[0].text for o in ref]
    assert all(f == "length" for _, f in got)
    wait_idle(server.url)


def test_async_chat_non_stream(server):
    async def main():
        async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0) as aclient:
            return await aclient.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "a"}],
                                                         max_tokens=4, temperature=0, extra_body={"ignore_eos": True})
    assert asyncio.run(main()).usage.completion_tokens == 4


def test_disconnects_abort_and_free_every_kv_block(server):
    url = server.url
    aborted = metric(url, "ridgeline_requests_total", 'status="abort"')
    body = dict(model=MODEL, prompt="a long story", max_tokens=480, ignore_eos=True, stream=True)

    async def main():
        async with httpx.AsyncClient(base_url=url, timeout=30) as c:
            streams = [await c.send(c.build_request("POST", "/v1/completions", json=body), stream=True)
                       for _ in range(4)]
            readers = [r.aiter_lines() for r in streams]  # kept alive: a collected reader closes its stream
            for lines in readers:
                while not (await anext(lines)).startswith("data: {"):
                    pass
            assert (await c.get("/metrics")).status_code == 200
            used = metric(url, "ridgeline_kv_cache_blocks_used")
            for r in streams:
                await r.aclose()  # mid-stream: the connection closes
            return used

    assert asyncio.run(main()) >= 4
    with pytest.raises(httpx.ReadTimeout):  # a non-stream client that gives up
        httpx.post(url + "/v1/completions", json={**body, "stream": False, "n": 2}, timeout=0.3)
    wait_idle(url)
    assert metric(url, "ridgeline_requests_total", 'status="abort"') == aborted + 4 + 2
    assert metric(url, "ridgeline_num_requests_waiting") == 0


def test_unknown_fields_are_ignored_with_a_warning(client, caplog):
    with caplog.at_level(logging.WARNING, logger="ridgeline.serve"):
        r = client.completions.create(model=MODEL, prompt="hi", max_tokens=2, extra_body={"frobnicate": 1})
    assert r.usage.completion_tokens <= 2
    assert "frobnicate" in caplog.text


def test_shutdown_drains_for_a_bounded_time_then_frees_everything(offline):
    engine = offline.engine  # idle: lend it to a server with a short drain
    srv = ServerThread(build_app(engine, ServerSettings(MODEL)), drain_timeout=0.3).start()
    body = dict(model=MODEL, prompt="a", max_tokens=480, ignore_eos=True, stream=True)
    rest = []
    with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=30) as r:
        lines = r.iter_lines()
        while not next(lines).startswith("data: {"):
            pass
        stopper = threading.Thread(target=srv.stop)
        stopper.start()
        with pytest.raises(httpx.RemoteProtocolError):  # cut after the drain timeout, not run to the end
            rest.extend(lines)
    stopper.join(10)
    assert not stopper.is_alive() and "data: [DONE]" not in rest
    assert not engine.has_unfinished()
    engine.kv.check_integrity()
    assert engine.kv.num_free_blocks == engine.kv.num_usable_blocks
