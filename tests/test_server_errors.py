"""Bad requests get OpenAI's error body with the documented status, and the server keeps serving:
invalid parameters, malformed JSON, context overflow, unknown model, auth, body size, queue limit.
What a client can send wrong is checked alike through every front (`front`: the server, a router over
one replica, a disaggregated front); the front's own refusals (key, body size) never reach a backend."""
from __future__ import annotations

import collections
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from front_helpers import KINDS, Backends, count_adds, serving_server
from server_helpers import StepGate, wait_until

from ridgeline.config import EngineConfig
from ridgeline.engine.llm_engine import LLMEngine
from ridgeline.serve.app import build_app
from ridgeline.serve.server import ServerThread
from ridgeline.serve.state import ServerSettings

KEY = "sekret"
AUTH = {"Authorization": f"Bearer {KEY}"}
CHAT, CMPL = "/v1/chat/completions", "/v1/completions"


def chat(**kw) -> dict:
    return {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **kw}


def cmpl(**kw) -> dict:
    return {"model": "tiny", "prompt": "hi", "max_tokens": 4, **kw}


@pytest.fixture(scope="module")
def app(tiny_llama):
    engine = LLMEngine(EngineConfig.from_kwargs(str(tiny_llama), progress=False, dtype="float32",
                                                kv_cache_memory="1MiB"))
    return build_app(engine, ServerSettings("tiny", api_key=KEY, max_waiting=2, max_body_bytes=4096))


@pytest.fixture(scope="module")
def server(app):
    with ServerThread(app) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=30) as c:
        yield c


@pytest.fixture(scope="module", params=KINDS)
def front(request, app, server, tiny_llama):
    if request.param == "server":
        reached = collections.Counter()
        count_adds(app.state.ridgeline.async_engine, reached)
        yield serving_server(server, reached)
        return
    with Backends(request.param, tiny_llama, kv_cache_memory="1MiB") as b, \
            b.serving(api_key=KEY, max_body_bytes=4096) as f:
        yield f


@pytest.fixture(scope="module")
def fclient(front):
    with httpx.Client(base_url=front.url, headers=AUTH, timeout=30) as c:
        yield c


def metric(client: httpx.Client, name: str) -> float:
    lines = [ln for ln in client.get("/metrics").text.splitlines() if ln.startswith(name + " ")]
    return float(lines[0].split()[-1])


NAN_BODY = b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "temperature": NaN}'

CASES = [  # id, route, body, status, param, code
    ("malformed-json", CHAT, b'{"model": "tiny", "messages": [', 400, None, None),
    ("body-not-object", CHAT, b"[1, 2]", 400, None, None),
    ("missing-model", CHAT, {"messages": [{"role": "user", "content": "hi"}]}, 400, "model", None),
    ("missing-messages", CHAT, {"model": "tiny"}, 400, "messages", None),
    ("empty-messages", CHAT, chat(messages=[]), 400, "messages", None),
    ("unknown-role", CHAT, chat(messages=[{"role": "wizard", "content": "hi"}]), 400, "messages", None),
    ("content-int", CHAT, chat(messages=[{"role": "user", "content": 5}]), 400, "messages", None),
    ("image-part", CHAT, chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
     400, "messages", None),
    ("max-tokens-string", CHAT, chat(max_tokens="5"), 400, "max_tokens", None),
    ("max-tokens-negative", CHAT, chat(max_tokens=-3), 400, "max_tokens", None),
    ("max-tokens-huge", CHAT, chat(max_tokens=10**9), 400, "max_tokens", "context_length_exceeded"),
    ("max-completion-tokens-zero", CHAT, chat(max_completion_tokens=0), 400, "max_completion_tokens", None),
    ("n-zero", CMPL, cmpl(n=0), 400, "n", None),
    ("n-1000", CMPL, cmpl(n=1000), 400, "n", None),
    ("n-float", CMPL, cmpl(n=1.5), 400, "n", None),
    ("temperature-nan", CHAT, NAN_BODY, 400, "temperature", None),
    ("temperature-string", CHAT, chat(temperature="hot"), 400, "temperature", None),
    ("temperature-negative", CHAT, chat(temperature=-1), 400, "temperature", None),
    ("top-p-over-1", CMPL, cmpl(top_p=1.5), 400, "top_p", None),
    ("presence-penalty-range", CMPL, cmpl(presence_penalty=3), 400, "presence_penalty", None),
    ("stream-not-bool", CHAT, chat(stream="yes"), 400, "stream", None),
    ("stream-options-without-stream", CHAT, chat(stream_options={"include_usage": True}), 400, "stream_options",
     None),
    ("top-logprobs-without-logprobs", CHAT, chat(top_logprobs=2), 400, "top_logprobs", None),
    ("top-logprobs-too-many", CHAT, chat(logprobs=True, top_logprobs=50), 400, "top_logprobs", None),
    ("logprobs-too-many", CMPL, cmpl(logprobs=100), 400, "logprobs", None),
    ("max-tokens-zero-without-echo-logprobs", CMPL, cmpl(max_tokens=0, logprobs=1), 400, "max_tokens", None),
    ("max-tokens-zero-chat", CHAT, chat(max_tokens=0), 400, "max_tokens", None),
    ("stop-not-strings", CMPL, cmpl(stop=[1]), 400, "stop", None),
    ("min-tokens-over-max", CMPL, cmpl(min_tokens=9), 400, "min_tokens", None),
    ("empty-prompt", CMPL, cmpl(prompt=""), 400, "prompt", None),
    ("empty-prompt-list", CMPL, cmpl(prompt=[]), 400, "prompt", None),
    ("mixed-prompt-list", CMPL, cmpl(prompt=["a", 1]), 400, "prompt", None),
    ("token-id-out-of-vocab", CMPL, cmpl(prompt=[1, 10**6]), 400, "prompt", None),
    ("prompt-over-context", CMPL, cmpl(prompt=[5] * 600), 400, "prompt", "context_length_exceeded"),
    ("unknown-model", CMPL, cmpl(model="gpt-9"), 404, "model", "model_not_found"),
    # OpenAI's ranges
    ("temperature-over-2", CHAT, chat(temperature=2.5), 400, "temperature", None),
    ("top-p-negative", CMPL, cmpl(top_p=-0.1), 400, "top_p", None),
    ("top-logprobs-21", CHAT, chat(logprobs=True, top_logprobs=21), 400, "top_logprobs", None),
    ("seed-float", CMPL, cmpl(seed=1.5), 400, "seed", None),
    # what the engine can hold: these used to pass and then fail the whole step
    ("seed-over-int64", CMPL, cmpl(seed=2**70), 400, "seed", None),
    ("seed-plus-n-overflows", CMPL, cmpl(seed=2**63 - 1, n=2), 400, "seed", None),
    ("top-k-over-int64", CMPL, cmpl(top_k=2**70), 400, "top_k", None),
    ("n-over-int64", CMPL, cmpl(n=2**70), 400, "n", None),
    ("stop-token-id-over-int64", CMPL, cmpl(stop_token_ids=[2**70]), 400, "stop_token_ids", None),
    ("min-tokens-over-int64", CHAT, chat(max_tokens=None, min_tokens=2**70), 400, "min_tokens", None),
    ("repetition-penalty-underflows", CMPL, cmpl(repetition_penalty=1e-300), 400, "repetition_penalty", None),
    ("stop-too-many", CMPL, cmpl(stop=["a"] * 65), 400, "stop", None),
    ("stop-too-long", CMPL, cmpl(stop=["a" * 257]), 400, "stop", None),
    # logit_bias
    ("logit-bias-not-object", CMPL, cmpl(logit_bias=[1]), 400, "logit_bias", None),
    ("logit-bias-key-not-int", CMPL, cmpl(logit_bias={"abc": 1}), 400, "logit_bias", None),
    ("logit-bias-key-not-ascii-digits", CMPL, cmpl(logit_bias={"\u0663": 1}), 400, "logit_bias", None),
    ("logit-bias-key-negative", CMPL, cmpl(logit_bias={"-1": 1}), 400, "logit_bias", None),
    ("logit-bias-key-out-of-vocab", CHAT, chat(logit_bias={"384": 1}), 400, "logit_bias", None),
    ("logit-bias-key-huge", CHAT, chat(logit_bias={"9" * 30: 1}), 400, "logit_bias", None),
    ("logit-bias-over-100", CMPL, cmpl(logit_bias={"5": 101}), 400, "logit_bias", None),
    ("logit-bias-string", CMPL, cmpl(logit_bias={"5": "x"}), 400, "logit_bias", None),
    # refused, never silently ignored
    ("best-of", CMPL, cmpl(best_of=2), 400, "best_of", "unsupported_parameter"),
    ("structural-tag-empty", CHAT, chat(structural_tag="{}"), 400, "structural_tag", None),
    ("chat-template-kwargs", CHAT, chat(chat_template_kwargs={"x": 1}), 400, "chat_template_kwargs",
     "unsupported_parameter"),
    ("bad-regex", CMPL, cmpl(guided_regex="(?=a)b"), 400, "guided_regex", "unsupported_parameter"),
    ("tools-remote-ref", CHAT, chat(tools=[{"type": "function", "function": {"name": "f", "parameters": {
        "$ref": "https://example.com/s.json"}}}]), 400, "tools", "unsupported_parameter"),
    ("tool-choice-without-tools", CHAT, chat(tool_choice="required"), 400, "tool_choice", None),
    ("tool-message-without-id", CHAT, chat(messages=[{"role": "tool", "content": "x"}]), 400, "messages", None),
    ("functions", CHAT, chat(functions=[{"name": "f"}]), 400, "functions", "unsupported_parameter"),
    ("function-call", CHAT, chat(function_call="auto"), 400, "function_call", "unsupported_parameter"),
    ("suffix", CMPL, cmpl(suffix="end"), 400, "suffix", "unsupported_parameter"),
    # text that is not valid Unicode, anywhere in the body
    ("surrogate-prompt", CMPL, b'{"model": "tiny", "prompt": "a\\ud800"}', 400, "prompt", None),
    ("surrogate-prompt-list", CMPL, b'{"model": "tiny", "prompt": ["ok", "\\udfff"]}', 400, "prompt", None),
    ("surrogate-model", CMPL, b'{"model": "\\ud800", "prompt": "hi"}', 400, "model", None),
    ("surrogate-stop", CMPL, b'{"model": "tiny", "prompt": "hi", "stop": ["\\ud800"]}', 400, "stop", None),
    ("surrogate-unknown-field-name", CMPL, b'{"model": "tiny", "prompt": "hi", "x\\ud800": 1}', 400, "x\\ud800",
     None),
    ("surrogate-unknown-field-value", CMPL, b'{"model": "tiny", "prompt": "hi", "x": {"y": ["\\ud800"]}}', 400,
     "x", None),
    ("surrogate-content", CHAT, b'{"model": "tiny", "messages": [{"role": "user", "content": "\\ud83d"}]}', 400,
     "messages", None),
    ("surrogate-name", CHAT, b'{"model": "tiny", "messages": [{"role": "user", "content": "a", "name": "\\udc00"}]}',
     400, "messages", None),
    ("surrogate-raw-bytes", CMPL, b'{"model": "tiny", "prompt": "a\xed\xa0\x80"}', 400, "prompt", None),
    ("invalid-utf8-bytes", CMPL, b'{"model": "tiny", "prompt": "a\xff"}', 400, None, None),
]


@pytest.mark.parametrize("route,body,status,param,code", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_request_gets_openai_error(fclient, route, body, status, param, code):
    if isinstance(body, bytes):
        r = fclient.post(route, content=body, headers={"Content-Type": "application/json"})
    else:
        r = fclient.post(route, json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"] and err["type"]
    assert (err["param"], err["code"]) == (param, code)


@pytest.mark.parametrize("route,body", [
    (CHAT, chat(response_format={"type": "text"}, tools=[], tool_choice="none", functions=[], function_call="none")),
    (CMPL, cmpl(suffix="", best_of=2, n=2, logit_bias={}, top_p=0, temperature=2)),
])
def test_defaults_of_unsupported_features_are_accepted(fclient, route, body):
    assert fclient.post(route, json=body).status_code == 200


def test_logit_bias_reaches_the_sampler(app, client):  # ban and unchanged rows: tests/test_sampler.py
    tok = app.state.ridgeline.engine.tokenizer
    body = cmpl(prompt="abc", max_tokens=4, temperature=1, seed=3, ignore_eos=True)
    forced = client.post(CMPL, json={**body, "logit_bias": {"65": 100}}).json()["choices"][0]["text"]
    assert forced == tok.decode([65] * 4) != client.post(CMPL, json=body).json()["choices"][0]["text"]


def test_prompt_over_context_names_both_numbers(fclient):
    msg = fclient.post(CMPL, json=cmpl(prompt=[5] * 600)).json()["error"]["message"]
    assert "600" in msg and "512" in msg


def test_unknown_route_and_method_are_openai_shaped(fclient):
    for r, status in ((fclient.get("/v1/nope"), 404), (fclient.get(CMPL), 405)):
        assert r.status_code == status and r.json()["error"]["message"]


def test_api_key(front, fclient):
    before = front.reached()
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        r = httpx.post(front.url + CMPL, json=cmpl(), headers=headers)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    r = httpx.post(front.url + CMPL, json=cmpl(), headers={"x-api-key": "wrong"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert front.reached() == before, "a request without the key got past the front"
    assert httpx.get(front.url + "/health").status_code == 200  # probes need no key
    r = httpx.post(front.url + CMPL, json=cmpl(), headers={"x-api-key": KEY})  # Anthropic's clients' header
    assert r.status_code == 200
    assert fclient.post(CMPL, json=cmpl()).status_code == 200
    assert front.reached() > before


def test_body_over_limit_is_413(front, fclient):
    before = front.reached()
    big = cmpl(prompt="x" * 5000)
    r = fclient.post(CMPL, json=big)
    assert r.status_code == 413 and "4096" in r.json()["error"]["message"]
    chunked = fclient.post(CMPL, content=iter([b'{"model": "tiny", "prompt": "', b"x" * 5000, b'"}']),
                           headers={"Content-Type": "application/json"})  # no Content-Length
    assert chunked.status_code == 413 and chunked.json()["error"]["message"]
    assert front.reached() == before, "a body over the front's limit got past it"


def test_over_max_waiting_is_429(app, client):
    url = str(client.base_url)
    with StepGate(app) as gate, ThreadPoolExecutor(2) as pool:  # held steps: requests queue up
        queued = [pool.submit(httpx.post, url + CMPL, json=cmpl(), headers=AUTH, timeout=60) for _ in range(2)]
        wait_until(lambda: metric(client, "ridgeline_num_requests_waiting") == 2, "two requests waiting")
        r = client.post(CMPL, json=cmpl())
        assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limit_exceeded"
        assert r.headers["retry-after"] == "1"
        gate.open()
        assert [f.result().status_code for f in queued] == [200, 200]


def test_engine_step_failure_fails_only_the_requests_in_flight(app, client):
    engine = app.state.ridgeline.engine
    step = engine.step

    def broken(*a, **k):
        del engine.step  # fail once
        raise RuntimeError("simulated kernel failure")

    engine.step = broken
    r = client.post(CMPL, json=cmpl())
    assert r.status_code == 500 and r.json()["error"]["message"] == "internal error"  # the cause stays in the log
    assert "simulated" not in r.text and r.json()["error"]["type"] == "server_error"
    assert client.post(CMPL, json=cmpl()).status_code == 200
    assert engine.step == step


def test_still_serves_and_leaks_nothing_after_errors(client):
    assert client.post(CMPL, json=cmpl(n=0)).status_code == 400
    r = client.post(CHAT, json=chat(max_tokens=3, ignore_eos=True))
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    assert metric(client, "ridgeline_kv_cache_blocks_used") == 0
    assert metric(client, "ridgeline_num_requests_waiting") == 0
    assert 'ridgeline_request_errors_total{code="400"}' in client.get("/metrics").text
