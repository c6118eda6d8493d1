"""Bad bodies against both generation routes: every one gets a 4xx in OpenAI's error shape (never a
500), poison requests are refused while other requests are mid-flight and those finish with their
offline-identical greedy output, and afterwards the server still serves and no KV block leaked. The
bodies go through every front alike (`front`: the server, a router over one replica, which parses and
tokenizes what it routes, and a disaggregated front, which re-sends them to two workers)."""
from __future__ import annotations

import asyncio
import collections
import json
import threading
import time

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from front_helpers import KINDS, Backends, Served
from hypothesis import strategies as st

from ridgeline import LLM, SamplingParams
from ridgeline.config import EngineConfig
from ridgeline.engine.llm_engine import LLMEngine
from ridgeline.serve.app import build_app
from ridgeline.serve.server import ServerThread
from ridgeline.serve.state import ServerSettings

OPTS = dict(dtype="float32", kv_cache_memory="2MiB", max_num_batched_tokens=256)
CHAT, CMPL = "/v1/chat/completions", "/v1/completions"
HEADERS = {"Content-Type": "application/json"}


def base(route: str) -> dict:
    if route == CHAT:
        return {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    return {"model": "tiny", "prompt": "hi", "max_tokens": 2}


@pytest.fixture(scope="module")
def served(tiny_llama):
    engine = LLMEngine(EngineConfig.from_kwargs(str(tiny_llama), progress=False, **OPTS))
    app = build_app(engine, ServerSettings("tiny", max_waiting=64))
    with ServerThread(app) as s:
        yield s.url, engine, app.state.ridgeline.async_engine


@pytest.fixture(scope="module")
def client(served):
    with httpx.Client(base_url=served[0], timeout=60) as c:
        yield c


@pytest.fixture(scope="module", params=KINDS)
def front(request, served, tiny_llama):
    if request.param == "server":
        url, _, async_engine = served
        yield Served("server", url, None, [async_engine], collections.Counter(), ())
        return
    with Backends(request.param, tiny_llama, max_num_batched_tokens=256) as b, b.serving() as f:
        yield f


@pytest.fixture(scope="module")
def fclient(front):
    with httpx.Client(base_url=front.url, timeout=60) as c:
        yield c


def assert_refused(r: httpx.Response) -> None:
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:300])
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"] and err["type"]


def assert_not_failed(r: httpx.Response) -> None:
    """A fuzzed body may happen to be valid (200); it must never be a server error."""
    assert r.status_code < 500, (r.status_code, r.text[:300])
    if r.status_code >= 400:
        assert_refused(r)


def nested(depth: int, leaf: str = "1") -> str:
    return "[" * depth + leaf + "]" * depth


CURATED = [  # route, raw body
    (CHAT, b'{"model": "tiny", "messages": ['),
    (CMPL, b""),
    (CMPL, b"null"), (CMPL, b"true"), (CMPL, b"42"), (CMPL, b'"a string"'), (CHAT, b"[1, 2]"),
    (CHAT, b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "temperature": NaN}'),
    (CMPL, b'{"model": "tiny", "prompt": "hi", "top_p": Infinity}'),
    (CMPL, b'{"model": "tiny", "prompt": "hi", "presence_penalty": -Infinity}'),
    (CMPL, b'{"model": "tiny", "prompt": "hi", "logit_bias": {"5": NaN}}'),
    (CMPL, b'{"model": "tiny", "prompt": "hi", "seed": 1e400}'),
    (CMPL, b'{"model": "tiny", "prompt": "hi", "n": ' + b"9" * 5000 + b"}"),  # past Python's int-parsing limit
    (CMPL, b'{"model": "tiny", "prompt": "hi", "x": ' + nested(5000).encode() + b"}"),  # past the parser's depth
    (CMPL, b'{"model": "tiny", "prompt": "hi", "stop": ' + nested(900, '"\\ud800"').encode() + b"}"),
    (CMPL, b'{"model": "tiny", "prompt": ' + nested(900).encode() + b"}"),
    (CHAT, b'{"model": "tiny", "messages": ' + nested(900, "{}").encode() + b"}"),
    (CMPL, b'{"model": "tiny", "prompt": "a\xff\xfe"}'),  # not UTF-8
    (CMPL, b'{"model": "tiny", "prompt": "a\xed\xa0\x80"}'),  # a UTF-8-encoded surrogate
    (CHAT, b'{"model": "tiny", "messages": [{"role": "user", "content": "\\ud800"}]}'),
    (CHAT, b'{"model": "tiny", "messages": [{"role": "user", "content": [{"type": "text", "text": "\\udc00"}]}]}'),
    (CHAT, b'{"model": "tiny", "messages": [{"role": "user", "content": {"text": "hi"}}]}'),
    (CMPL, b'{"model": "tiny", "prompt": [{"text": "hi"}]}'),
    (CMPL, b'{"model": "tiny", "prompt": [[1, 2], "mixed"]}'),
    (CMPL, b'{"model": "tiny", "prompt": [[]]}'),
    (CMPL, b'{"model": "tiny", "prompt": "hi", "stream": true, "n": 0}'),
    (CMPL, b'{"model": "tiny", "prompt": "hi", "stream_options": {"include_usage": "yes"}, "stream": true}'),
    (CHAT, b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "tool_choice": {"type": "function"}}'),
    (CMPL, b'{"model": "tiny", "prompt": "hi", "\\ud800\\n": 1}'),
    (CMPL, b'{"model": ["tiny"], "prompt": "hi"}'),
    (CMPL, b'\xef\xbb\xbf{"model": "tiny", "prompt": "hi", "n": -1}'),  # a byte-order mark, then a bad n
]


@pytest.mark.parametrize("route,body", CURATED, ids=[f"{i}-{r.split('/')[-1]}" for i, (r, _) in enumerate(CURATED)])
def test_curated_bad_bodies_are_refused(fclient, route, body):
    assert_refused(fclient.post(route, content=body, headers=HEADERS))


FIELDS = ["model", "prompt", "messages", "n", "temperature", "top_p", "top_k", "min_p", "seed", "stop",
          "stop_token_ids", "max_tokens", "max_completion_tokens", "min_tokens", "logprobs", "top_logprobs",
          "logit_bias", "presence_penalty", "frequency_penalty", "repetition_penalty", "best_of", "stream",
          "stream_options", "echo", "ignore_eos", "skip_special_tokens", "user", "cache_salt", "response_format",
          "tools", "tool_choice", "suffix", "structured_outputs", "guided_json", "guided_regex", "guided_choice",
          "guided_grammar", "unknown_field"]
SAMPLED = ("seed", "top_k", "min_p", "top_p", "repetition_penalty", "logit_bias")  # matter only when sampling
NUMERIC = ["n", "temperature", "top_p", "top_k", "min_p", "seed", "max_tokens", "max_completion_tokens", "min_tokens",
           "logprobs", "top_logprobs", "presence_penalty", "frequency_penalty", "repetition_penalty", "best_of"]
EDGES = [2**63, 2**64 + 1, -(2**63) - 1, 2**63 - 1, -1, 0, 10**30, 1e39, 1e-300, 2.5]  # past int64 / float32 ...
TEXT = ["model", "prompt", "stop", "user", "cache_salt", "suffix", "unknown_field"]
SWEEP = ([(f, v) for f in NUMERIC for v in EDGES] + [(f, [v]) for f in ("stop_token_ids", "prompt") for v in EDGES]
         + [("logit_bias", {"5": v}) for v in EDGES] + [("logit_bias", {"384": 1}), ("logit_bias", {"\ud800": 1})]
         + [(f, v) for f in TEXT for v in ("\ud800", ["a\udfff"], {"k\udc00": 1})])


def fuzz_post(client: httpx.Client, route: str, field: str, value, raw: bool = False) -> httpx.Response:
    body = {**base(route), field: value}
    if field in SAMPLED:
        body["temperature"] = 1.0
    # surrogates travel escaped (\ud800) or, raw, as their UTF-8-style bytes
    data = (json.dumps(body, ensure_ascii=False).encode("utf-8", "surrogatepass") if raw
            else json.dumps(body).encode())
    return client.post(route, content=data, headers=HEADERS)


def test_every_field_with_edge_values_never_fails_the_server(fclient):
    failed = []
    for i, (field, value) in enumerate(SWEEP):
        r = fuzz_post(fclient, CHAT if i % 2 else CMPL, field, value, raw=i % 3 == 0)
        if r.status_code >= 500 or (r.status_code >= 400 and set(r.json().get("error", ())) !=
                                    {"message", "type", "param", "code"}):
            failed.append((field, value, r.status_code, r.text[:120]))
    assert not failed


SURROGATES = st.sampled_from(["\ud800", "a\udfff", "\udc00b", "ok\ud83d"])
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(2**80), 2**80),
                    st.floats(allow_nan=False, allow_subnormal=False),  # the CPU kernels flush subnormals
                    st.text(max_size=6), SURROGATES)
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
    st.one_of(st.text(max_size=4), SURROGATES), inner, max_size=3), max_leaves=6)
FUZZ = settings(derandomize=True, database=None, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@settings(FUZZ, max_examples=80)
@given(route=st.sampled_from([CHAT, CMPL]), field=st.sampled_from(FIELDS), value=VALUES, raw=st.booleans())
def test_fuzzed_fields_never_fail_the_server(fclient, route, field, value, raw):
    assert_not_failed(fuzz_post(fclient, route, field, value, raw))


@settings(FUZZ, max_examples=30)
@given(route=st.sampled_from([CHAT, CMPL]), body=VALUES)
def test_fuzzed_whole_bodies_never_fail_the_server(fclient, route, body):
    assert_not_failed(fclient.post(route, content=json.dumps(body).encode(), headers=HEADERS))


class StepGate:
    """Holds the engine's step thread before each step until the test lets one through."""

    def __init__(self, engine: LLMEngine):
        self.engine, self.step = engine, engine.step
        self.permits = threading.Semaphore(0)
        self.opened = threading.Event()
        self.steps = 0
        engine.step = self

    def __call__(self, *args, **kwargs):
        if not self.opened.is_set():
            assert self.permits.acquire(timeout=60)  # a safety net: the test always lets it go
        try:
            return self.step(*args, **kwargs)
        finally:
            self.steps += 1

    async def step_once(self) -> None:
        before = self.steps
        self.permits.release()
        await until(lambda: self.steps > before)

    def open(self) -> None:
        self.opened.set()
        self.permits.release(1000)
        del self.engine.step


async def until(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout  # a safety net only: the condition is what is waited for
    while not condition():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.005)


POISON = [  # each used to pass validation and then fail the engine step of every co-batched request
    (CMPL, {"seed": 2**70, "temperature": 1}),
    (CMPL, {"seed": 2**63 - 1, "n": 2, "temperature": 1}),  # choice 1: seed + 1 overflows
    (CMPL, {"top_k": 2**70, "temperature": 1}),
    (CMPL, {"stop_token_ids": [2**70]}),
    (CHAT, {"min_tokens": 2**70, "max_tokens": None}),
    (CMPL, {"n": 2**70}),
    (CMPL, {"repetition_penalty": 1e-300}),
    (CMPL, {"stop": ["ab"] * 5000}),
    (CMPL, {"prompt": "x\ud800"}),
    (CHAT, {"messages": [{"role": "user", "content": "\ud800"}]}),
    (CHAT, {"chat_template_kwargs": {"enable_thinking": True}}),
    (CMPL, {"guided_regex": "(a)\\1"}),
]
POISON_AT_ADMISSION = [(CMPL, {"logit_bias": {"384": 5}})]  # needs the model's vocabulary: checked on add


def post(c: httpx.AsyncClient, route: str, extra: dict):
    body = json.dumps({**base(route), **extra}).encode()  # ascii: lone surrogates travel escaped
    return c.post(route, content=body, headers=HEADERS)


async def read_stream(c: httpx.AsyncClient, body: dict) -> tuple[str, str | None]:
    text, finish = "", None
    async with c.stream("POST", CMPL, json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                assert "error" not in chunk, chunk
                text += chunk["choices"][0]["text"]
                finish = chunk["choices"][0]["finish_reason"] or finish
    return text, finish


@pytest.fixture(scope="module")
def offline(tiny_llama):
    return LLM(str(tiny_llama), progress=False, **OPTS)


def test_poison_requests_are_refused_while_others_run(served, offline):
    url, engine, async_engine = served
    prompts = [f"stream {i}: " + "xyz"[: i % 3] for i in range(4)]
    greedy = dict(model="tiny", max_tokens=32, ignore_eos=True, stream=True, temperature=0)
    bodies = [{**greedy, "prompt": p} for p in prompts]
    bodies.append({**greedy, "prompt": prompts[1], "temperature": 1e-300, "seed": 5})  # below epsilon: greedy
    bodies.append({**greedy, "prompt": prompts[2], "temperature": 1.0, "top_k": 2**62, "seed": 1})  # valid
    ref = offline.generate(prompts, SamplingParams(temperature=0, max_tokens=32, ignore_eos=True), use_tqdm=False)
    want = [o.outputs[0].text for o in ref] + [ref[1].outputs[0].text]
    gate = StepGate(engine)

    async def main():
        async with httpx.AsyncClient(base_url=url, timeout=60) as c:
            streams = [asyncio.create_task(read_stream(c, b)) for b in bodies]
            try:
                await until(lambda: async_engine.num_waiting == len(bodies))  # all posted, no step has run
                await gate.step_once()  # the held step; every stream is added right after it
                await until(lambda: len(engine.groups) == len(bodies))
                # the step thread is held: a poison request admitted now would share the next step
                refused = await asyncio.wait_for(asyncio.gather(*(post(c, *p) for p in POISON)), 30)
                waiting = async_engine.num_waiting
                late = asyncio.ensure_future(asyncio.gather(*(post(c, *p) for p in POISON_AT_ADMISSION)))
                await until(lambda: async_engine.num_waiting > waiting)  # posted: applied after the next step
                await gate.step_once()
                refused += await asyncio.wait_for(late, 30)
                assert len(engine.groups) == len(bodies)  # the streams were in flight the whole time
            finally:
                gate.open()
            return refused, await asyncio.gather(*streams)

    refused, results = asyncio.run(main())
    for r in refused:
        assert r.status_code == 400, r.text
        assert_refused(r)
    assert [t for t, _ in results[:5]] == want
    assert all(f == "length" for _, f in results)


def test_after_all_that_every_front_serves_and_nothing_leaked(front, fclient):
    r = fclient.post(CMPL, json={**base(CMPL), "max_tokens": 3, "ignore_eos": True})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    front.wait_idle()


def test_after_all_that_the_server_serves_and_leaked_nothing(served, client):
    engine = served[1]
    r = client.post(CMPL, json={**base(CMPL), "max_tokens": 3, "ignore_eos": True})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    deadline = time.monotonic() + 30  # a safety net: aborted requests free their blocks at the next step
    while engine.has_unfinished() or engine.kv.num_free_blocks != engine.kv.num_usable_blocks:
        assert time.monotonic() < deadline, "KV blocks were not freed"
        time.sleep(0.01)
    engine.kv.check_integrity()
