"""The OpenAI-compatible server on the tiny model, through the official `openai` client (sync and
async, streaming and not), against the offline engine; disconnects free KV blocks; the small routes."""
from __future__ import annotations

import asyncio
import json
import logging
import threading

import httpx
import openai
import pytest
from server_helpers import StepGate, metric, wait_idle, wait_until

from ridgeline import LLM, SamplingParams
from ridgeline.config import EngineConfig
from ridgeline.engine.llm_engine import LLMEngine
from ridgeline.serve.app import build_app
from ridgeline.serve.server import ServerThread
from ridgeline.serve.state import ServerSettings

OPTS = dict(dtype="float32", kv_cache_memory="2MiB", max_num_batched_tokens=256)
MODEL = "tiny"


@pytest.fixture(scope="module")
def engine(tiny_llama):
    return LLMEngine(EngineConfig.from_kwargs(str(tiny_llama), progress=False, **OPTS))


@pytest.fixture(scope="module")
def server(engine):
    with ServerThread(build_app(engine, ServerSettings(MODEL, max_waiting=64))) as s:
        yield s


@pytest.fixture(scope="module")
def offline(tiny_llama):
    return LLM(str(tiny_llama), progress=False, **OPTS)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


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


def test_disconnects_abort_and_free_every_kv_block(server, engine):
    url = server.url
    aborted = metric(url, "ridgeline_requests_total", 'status="abort"')
    # logprobs: every token makes a chunk (text alone may wait for the rest of a UTF-8 character)
    body = dict(model=MODEL, prompt="a long story", max_tokens=480, ignore_eos=True, stream=True, logprobs=0)

    async def streams_then_disconnect(gate: StepGate) -> float:
        async with httpx.AsyncClient(base_url=url, timeout=60) as c:
            streams = [await c.send(c.build_request("POST", "/v1/completions", json=body), stream=True)
                       for _ in range(4)]
            readers = [r.aiter_lines() for r in streams]  # kept alive: a collected reader closes its stream
            while metric(url, "ridgeline_num_requests_running") < 4:  # every stream has a token, none is done
                await asyncio.to_thread(gate.step)
            for lines in readers:
                while not (await anext(lines)).startswith("data: {"):
                    pass
            used = metric(url, "ridgeline_kv_cache_blocks_used")
            for r in streams:
                await r.aclose()  # mid-stream: the connection closes
            return used

    with StepGate(server.app) as gate:
        assert asyncio.run(streams_then_disconnect(gate)) >= 4
        wait_until(lambda: metric(url, "ridgeline_requests_total", 'status="abort"') == aborted + 4)
        with pytest.raises(httpx.ReadTimeout):  # a non-stream client that gives up: held, it cannot finish
            httpx.post(url + "/v1/completions", json={**body, "stream": False, "n": 2}, timeout=0.3)
        wait_until(lambda: metric(url, "ridgeline_requests_total", 'status="abort"') == aborted + 4 + 2)
    wait_idle(url)
    assert metric(url, "ridgeline_requests_total", 'status="abort"') == aborted + 4 + 2


def test_unknown_fields_are_ignored_with_a_warning(client, caplog):
    with caplog.at_level(logging.WARNING, logger="ridgeline.serve"):
        r = client.completions.create(model=MODEL, prompt="hi", max_tokens=2, extra_body={"frobnicate": 1})
    assert r.usage.completion_tokens <= 2
    assert "frobnicate" in caplog.text


def test_a_field_name_cannot_forge_log_lines(server, caplog):
    forged = "x\nCRITICAL ridgeline.serve: forged\r\x1b[2J"
    with caplog.at_level(logging.WARNING, logger="ridgeline.serve"):
        r = httpx.post(server.url + "/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 1,
                                                             forged: 1}, timeout=60)
    assert r.status_code == 200
    [record] = [r for r in caplog.records if "unknown field" in r.getMessage()]
    line = record.getMessage()
    assert "\n" not in line and "\r" not in line and "\x1b" not in line
    assert "x\\nCRITICAL ridgeline.serve: forged\\r\\x1b[2J" in line


def test_models_by_id_head_and_fingerprint(server, client):
    card = httpx.get(server.url + "/v1/models/" + MODEL).json()
    assert card["id"] == MODEL and card["object"] == "model" and client.models.retrieve(MODEL).id == MODEL
    r = httpx.get(server.url + "/v1/models/gpt-9")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    for path in ("/health", "/v1/models", "/v1/models/" + MODEL):
        head = httpx.head(server.url + path)
        assert head.status_code == 200 and head.content == b""
    kw = dict(model=MODEL, max_tokens=3, temperature=0)
    cmpl = client.completions.create(prompt="hi", **kw)
    chat = client.chat.completions.create(messages=[{"role": "user", "content": "hi"}], **kw)
    fp = cmpl.system_fingerprint
    assert fp and fp.startswith("fp_") and chat.system_fingerprint == fp
    chunks = list(client.chat.completions.create(messages=[{"role": "user", "content": "hi"}], stream=True, **kw))
    chunks += list(client.completions.create(prompt="hi", stream=True, **kw))
    assert {c.system_fingerprint for c in chunks} == {fp}


def test_docs_work_offline(server):
    r = httpx.get(server.url + "/docs")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "/v1/chat/completions" in r.text and "/v1/completions" in r.text
    low = r.text.lower()
    assert "http://" not in low and "https://" not in low and "<script" not in low  # nothing to fetch
    assert httpx.get(server.url + "/openapi.json").json()["paths"]
    assert httpx.get(server.url + "/redoc").status_code == 404


def test_one_log_line_per_finished_request(server, client, caplog):
    with caplog.at_level(logging.INFO, logger="ridgeline.serve"):
        r = client.completions.create(model=MODEL, prompt="abc", max_tokens=5, temperature=0,
                                      extra_body={"ignore_eos": True})
        list(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                            max_tokens=2, stream=True, extra_body={"ignore_eos": True}))
    lines = [rec.getMessage() for rec in caplog.records if rec.getMessage().startswith(("cmpl-", "chatcmpl-"))]
    assert len(lines) == 2
    assert lines[0].startswith(r.id + " 200: 3 prompt + 5 completion tokens, TTFT ")
    assert lines[1].startswith("chatcmpl-") and " 200: " in lines[1] and "+ 2 completion tokens" in lines[1]


def test_tokenizing_runs_off_the_event_loop(server, engine, client):
    """While one huge prompt is being tokenized (held here on an event), every route still answers."""
    tok = engine.tokenizer
    encode, template = tok.encode, tok.apply_chat_template
    entered, release = threading.Event(), threading.Event()

    def held(fn):
        def run(text, *a, **k):
            if "HUGE" in str(text):
                entered.set()
                assert release.wait(60)
            return fn(text, *a, **k)
        return run

    tok.encode, tok.apply_chat_template = held(encode), held(template)
    try:
        for route, body in (("/v1/completions", {"prompt": "HUGE" + "x" * 100}),
                            ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
                                {"type": "text", "text": "HUGE"}]}]})):
            entered.clear()
            release.clear()
            big = {"model": MODEL, "max_tokens": 2, "temperature": 0, **body}
            with httpx.Client(base_url=server.url, timeout=60) as c:
                thread = threading.Thread(target=lambda: results.append(c.post(route, json=big)))
                results: list[httpx.Response] = []
                thread.start()
                assert entered.wait(60)
                assert httpx.get(server.url + "/health").json() == {"status": "ok"}
                assert client.completions.create(model=MODEL, prompt="hi", max_tokens=2).choices
                assert thread.is_alive() and not results  # the huge one is still being tokenized
                release.set()
                thread.join(60)
                assert results[0].status_code == 200
    finally:
        release.set()
        del tok.encode, tok.apply_chat_template


def test_shutdown_ends_what_outlives_the_drain_with_an_error_and_frees_everything(offline, caplog):
    """Held at the gate, a stream and a non-stream request are still running when the drain timeout
    passes: the stream gets an in-band error then [DONE], the other a JSON 503; one log line each."""
    engine = offline.engine  # idle: lend it to a server with a short drain
    srv = ServerThread(build_app(engine, ServerSettings(MODEL)), drain_timeout=0.3).start()
    body = dict(model=MODEL, prompt="a", max_tokens=480, ignore_eos=True, logprobs=0)
    plain: list[httpx.Response] = []
    uvicorn_log = logging.getLogger("uvicorn.error")  # does not propagate to caplog's root handler
    uvicorn_log.addHandler(caplog.handler)
    with caplog.at_level(logging.INFO), StepGate(srv.app) as gate:
        with httpx.stream("POST", srv.url + "/v1/completions", json={**body, "stream": True}, timeout=60) as r:
            lines = r.iter_lines()
            gate.step()  # the stream's first token
            while not next(lines).startswith("data: {"):
                pass
            waiter = threading.Thread(target=lambda: plain.append(
                httpx.post(srv.url + "/v1/completions", json=body, timeout=60)))
            waiter.start()
            wait_until(lambda: metric(srv.url, "ridgeline_num_requests_waiting") == 1, "second request admitted")
            stopper = threading.Thread(target=srv.stop)
            stopper.start()
            rest = [line for line in lines if line]
            waiter.join(60)
        gate.open()  # the step thread may finish its step; the engine then drops both requests
        stopper.join(60)
    uvicorn_log.removeHandler(caplog.handler)
    assert not stopper.is_alive()
    assert rest[-1] == "data: [DONE]"
    error = json.loads(rest[-2].removeprefix("data: "))["error"]
    assert error["type"] == "service_unavailable" and "drain timeout" in error["message"]
    assert all(json.loads(line[6:]).get("choices") for line in rest[:-2])  # tokens, then the error
    [r] = plain
    assert r.status_code == 503 and r.headers["content-type"] == "application/json"
    assert r.json()["error"]["type"] == "service_unavailable"
    assert len([m for m in caplog.messages if m.startswith("shutdown: aborted")]) == 2
    assert not [rec for rec in caplog.records if rec.levelno >= logging.ERROR], caplog.text
    assert "CancelledError" not in caplog.text and "Traceback" not in caplog.text
    assert "Waiting for application shutdown" in caplog.text  # uvicorn's log was captured too
    assert not engine.has_unfinished()
    engine.kv.check_integrity()
    assert engine.kv.num_free_blocks == engine.kv.num_usable_blocks


def test_echo_with_logprobs_scores_the_prompt(server, offline):
    """Legacy echo + logprobs: the prompt's tokens come back with their logprobs (the first null),
    then the completion's; max_tokens 0 scores the prompt alone. Stream and non-stream agree."""
    prompt = "The quick brown fox"
    ids = offline.tokenizer.encode(prompt)
    ref = offline.generate(prompt, SamplingParams(temperature=0, max_tokens=0, prompt_logprobs=2), use_tqdm=False)[0]
    body = dict(model=MODEL, prompt=prompt, echo=True, logprobs=2, max_tokens=0)
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()
    [c] = r["choices"]
    lp = c["logprobs"]
    assert c["text"] == prompt and c["finish_reason"] == "length" and r["usage"]["completion_tokens"] == 0
    assert len(lp["tokens"]) == len(ids) and lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert lp["token_logprobs"][1:] == pytest.approx([x.logprob for x in ref.prompt_logprobs[1:]], abs=1e-5)
    assert all(len(top) <= 2 for top in lp["top_logprobs"][1:])
    body.update(max_tokens=5, temperature=0, ignore_eos=True)
    whole = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()["choices"][0]
    assert whole["text"].startswith(prompt) and len(whole["logprobs"]["tokens"]) == len(ids) + 5
    assert whole["logprobs"]["token_logprobs"][:len(ids)] == lp["token_logprobs"]
    text, tokens = "", []
    with httpx.stream("POST", server.url + "/v1/completions", json={**body, "stream": True}, timeout=60) as s:
        for line in s.iter_lines():
            if line.startswith("data: {"):
                ch = json.loads(line[6:])["choices"][0]
                text += ch["text"]
                tokens += (ch["logprobs"] or {}).get("tokens", [])
    assert text == whole["text"] and tokens == whole["logprobs"]["tokens"]


def test_the_listening_socket_is_tcp_so_responses_skip_nagle():
    """asyncio turns on TCP_NODELAY for accepted connections only when the listening socket names
    IPPROTO_TCP; without it each response waited ~40 ms for the client's delayed ACK."""
    import socket
    from ridgeline.http.server import bind
    sock = bind("127.0.0.1", 0)
    try:
        assert sock.proto == socket.IPPROTO_TCP
    finally:
        sock.close()
