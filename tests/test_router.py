"""`ridgeline router` in front of two tiny-model replicas: OpenAI routes, streaming and errors passed
through, aggregated /metrics, cache-aware routing from the replicas' KV events; start-up checks; a
replica that fails before answering (retried elsewhere) or in the middle of a stream (in-band error)."""
from __future__ import annotations

import asyncio

import httpx
import openai
import pytest
from router_helpers import CHUNK, FakeReplica
from server_helpers import metric, wait_until

from ridgeline.config import EngineConfig
from ridgeline.engine.llm_engine import LLMEngine
from ridgeline.http.front_limits import FrontLimits
from ridgeline.router.core import Router, RouterSettings
from ridgeline.router.policy import Route
from ridgeline.router.replica import Replica
from ridgeline.router.serve import RouterThread, build_router
from ridgeline.router.startup import RouterConfigError
from ridgeline.serve.app import build_app
from ridgeline.serve.server import ServerThread
from ridgeline.serve.state import ServerSettings

pytest.importorskip("zmq", reason="pyzmq is not installed (pip install 'ridgeline[router]')")

OPTS = dict(dtype="float32", kv_cache_memory="2MiB", max_num_batched_tokens=256)
MODEL = "tiny"


@pytest.fixture(scope="module")
def replicas(tiny_llama):
    servers = []
    for _ in range(2):
        engine = LLMEngine(EngineConfig.from_kwargs(str(tiny_llama), progress=False, **OPTS))
        settings = ServerSettings(MODEL, quiet=True, kv_events_endpoint="tcp://127.0.0.1:*")
        servers.append(ServerThread(build_app(engine, settings)).start())
    yield servers
    for s in servers:
        s.stop()


@pytest.fixture(scope="module")
def router(replicas):
    r = asyncio.run(build_router([s.url for s in replicas], RouterSettings("cache-aware", health_interval=0.5)))
    with RouterThread(r) as t:
        yield t


@pytest.fixture(scope="module")
def client(router):
    return openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0)


def test_models_health_and_summed_metrics(router, client, replicas):
    assert [m.id for m in client.models.list().data] == [MODEL]
    health = httpx.get(router.url + "/health").json()
    assert health["status"] == "ok" and set(health["replicas"].values()) == {"up"}
    assert metric(router.url, "ridgeline_kv_cache_blocks_total") == 2 * metric(replicas[0].url,
                                                                               "ridgeline_kv_cache_blocks_total")
    assert metric(router.url, "ridgeline_router_replica_up", f'replica="{replicas[0].url}"') == 1


def test_embeddings_and_tokenize_reach_a_replica(client, replicas, router):
    direct = openai.OpenAI(base_url=replicas[0].url + "/v1", api_key="x", max_retries=0)
    want = direct.embeddings.create(model=MODEL, input="hello").data[0].embedding
    assert client.embeddings.create(model=MODEL, input="hello").data[0].embedding == pytest.approx(want, abs=1e-6)
    r = httpx.post(router.url + "/tokenize", json={"prompt": "hello"})
    assert r.status_code == 200 and r.json()["count"] == httpx.post(replicas[0].url + "/tokenize",
                                                                     json={"prompt": "hello"}).json()["count"]


def test_chat_and_stream_pass_through(client, replicas):
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "tell me"}], temperature=0, max_tokens=12,
              extra_body={"ignore_eos": True})
    direct = openai.OpenAI(base_url=replicas[0].url + "/v1", api_key="x", max_retries=0)
    ref = direct.chat.completions.create(**kw).choices[0].message.content
    assert client.chat.completions.create(**kw).choices[0].message.content == ref
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ref
    assert chunks[-1].usage.completion_tokens == 12
    text = client.completions.create(model=MODEL, prompt="abc", max_tokens=5, temperature=0).choices[0].text
    assert text == direct.completions.create(model=MODEL, prompt="abc", max_tokens=5, temperature=0).choices[0].text


def test_the_ignored_fields_header_comes_through_the_router(router):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "my_flag": 1}
    for stream in (False, True):
        r = httpx.post(router.url + "/v1/chat/completions", json={**body, "stream": stream}, timeout=60)
        assert r.status_code == 200 and r.headers["x-ridgeline-ignored-fields"] == "my_flag"


def test_errors_pass_through_with_status(router, replicas):
    body = {"model": MODEL, "prompt": "x", "max_tokens": -1}
    via, direct = httpx.post(router.url + "/v1/completions", json=body), httpx.post(
        replicas[0].url + "/v1/completions", json=body)
    assert via.status_code == direct.status_code == 400 and via.json() == direct.json()
    r = httpx.post(router.url + "/v1/chat/completions", json={"model": "gpt-4", "messages": [{"role": "user",
                                                                                             "content": "hi"}]})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    r = httpx.post(router.url + "/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]


def test_cache_aware_keeps_a_prefix_on_one_replica(router, client):
    rt: Router = router.router
    system = "You are a helpful assistant for tenant seven. " * 4  # ~180 tokens: 11 full blocks
    msgs = lambda q: [{"role": "system", "content": system}, {"role": "user", "content": q}]  # noqa: E731
    client.chat.completions.create(model=MODEL, messages=msgs("first"), max_tokens=2)
    route = rt.hasher.route("/v1/chat/completions", {"model": MODEL, "messages": msgs("second")})
    # the replica's KV events reach the index: the router's hashes are the ones the replica stored
    wait_until(lambda: any(rt.index.matched_blocks(route.hashes, [r.name]).get(r.name, 0) >= 11
                           for r in rt.replicas if set(route.hashes[:11]) <= rt.index.held.get(r.name, set())),
               "the first request's blocks in the index")
    [holder] = [r for r in rt.replicas if set(route.hashes[:11]) <= rt.index.held.get(r.name, set())]
    before = holder.routed
    for i in range(4):
        raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=msgs(f"question {i}"),
                                                               max_tokens=2)
        cached = raw.parse().usage.prompt_tokens_details.cached_tokens
        assert cached >= 11 * 16
        # the router says where it sent the request and what it expected there: exactly what was cached
        assert raw.headers["x-ridgeline-replica"] == holder.url
        assert int(raw.headers["x-ridgeline-expected-cached-tokens"]) == cached
    assert holder.routed == before + 4


def test_start_up_checks(replicas):
    settings = RouterSettings("least-load")
    with pytest.raises(RouterConfigError, match="no replicas"):
        asyncio.run(build_router([], settings))
    dead = FakeReplica()
    dead.close()
    with pytest.raises(RouterConfigError, match=f"replica {dead.url} is unreachable"):
        asyncio.run(build_router([replicas[0].url, dead.url], settings))
    other = FakeReplica(model="another")
    try:
        with pytest.raises(RouterConfigError, match="replicas serve different models.*serves `another`"):
            asyncio.run(build_router([replicas[0].url, other.url], settings))
        with pytest.raises(RouterConfigError, match="needs KV events"):
            asyncio.run(build_router([other.url], RouterSettings("cache-aware")))
    finally:
        other.close()


def _fake_router(fakes: list[FakeReplica], policy: str = "round-robin") -> RouterThread:
    reps = [Replica(f.url, f.info()) for f in fakes]
    return RouterThread(Router(reps, RouterSettings(policy, health_interval=3600))).start()


def test_replica_dropping_before_an_answer_is_retried_elsewhere():
    drop, ok = FakeReplica(mode="drop"), FakeReplica()
    rt = _fake_router([drop, ok])
    try:
        for _ in range(3):
            r = httpx.post(rt.url + "/v1/chat/completions", json={"stream": True})
            assert r.status_code == 200 and r.content == CHUNK + b"data: [DONE]\n\n"
        assert drop.posts == 1 and ok.posts == 3
        down = rt.router.replicas[0]
        assert not down.up and "RemoteProtocolError" in down.reason
        assert metric(rt.url, "ridgeline_router_retries_total") == 1
        health = httpx.get(rt.url + "/health").json()
        assert health["replicas"][drop.url].startswith("down")
    finally:
        rt.stop()
        drop.close()
        ok.close()


def test_replica_dying_mid_stream_ends_it_with_an_error_and_all_down_is_503():
    cut = FakeReplica(mode="cut")
    rt = _fake_router([cut])
    try:
        with httpx.stream("POST", rt.url + "/v1/chat/completions", json={"stream": True}) as r:
            body = r.read()
        assert r.status_code == 200 and body.startswith(CHUNK)
        events = [e for e in body.split(b"\n\n") if e.startswith(b"data: ")]
        assert b'"code": "replica_failed"' in events[-2] and events[-1] == b"data: [DONE]"
        assert cut.posts == 1, "a stream that has started is never retried"
        r = httpx.post(rt.url + "/v1/completions", json={"prompt": "x"})
        assert r.status_code == 503 and r.json()["error"]["code"] == "no_replica_available"
        assert cut.url in r.json()["error"]["message"]
        assert httpx.get(rt.url + "/health").status_code == 503
    finally:
        rt.stop()
        cut.close()


def test_health_check_takes_a_replica_out_and_back():
    fake = FakeReplica()
    rep = Replica(fake.url, fake.info())
    router = Router([rep], RouterSettings("least-load"))

    async def run():
        await router.start()
        try:
            await router.check_all()
            assert rep.up
            port = fake.sock.getsockname()[1]
            fake.close()
            await router.check_all()
            assert not rep.up and "health check failed" in rep.reason
            back = _listen_on(port)
            try:
                await router.check_all()
                assert rep.up
            finally:
                back.close()
        finally:
            await router.stop()
    asyncio.run(run())


def _listen_on(port: int) -> FakeReplica:
    fake = FakeReplica.__new__(FakeReplica)
    import socket
    import threading
    fake.model, fake.mode, fake.posts = "tiny", "ok", 0
    fake.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    fake.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    fake.sock.bind(("127.0.0.1", port))
    fake.sock.listen(16)
    fake.url = f"http://127.0.0.1:{port}"
    fake.thread = threading.Thread(target=fake._serve, daemon=True)
    fake.thread.start()
    return fake


class SpyHasher:
    """A PromptHasher that records what it was asked to tokenize."""

    def __init__(self):
        self.calls: list[str] = []

    def route(self, path: str, body, tenant=None) -> Route:
        self.calls.append(path)
        return Route()


def test_a_request_is_authenticated_before_it_is_tokenized_and_replicas_get_their_own_key():
    fake, hasher = FakeReplica(), SpyHasher()
    settings = RouterSettings("round-robin", health_interval=3600, replica_api_key="replica-key",
                              limits=FrontLimits(api_key="router-key"))
    rt = RouterThread(Router([Replica(fake.url, fake.info())], settings, hasher)).start()
    try:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Bearer replica-key"}):
            r = httpx.post(rt.url + "/v1/chat/completions", json={"stream": True}, headers=headers)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert hasher.calls == [] and fake.posts == 0, "an unauthenticated request was tokenized or forwarded"
        r = httpx.post(rt.url + "/v1/chat/completions", json={"stream": True},
                       headers={"Authorization": "Bearer router-key"})
        assert r.status_code == 200 and hasher.calls == ["/v1/chat/completions"]
        assert fake.auth == ["Bearer replica-key"], "the replica got the client's key, not its own"
        assert metric(rt.url, "ridgeline_router_requests_total", 'replica="router",status="401"',
                      headers={"Authorization": "Bearer router-key"}) == 3
    finally:
        rt.stop()
        fake.close()


def test_metrics_key_is_looked_up_by_its_keyed_hash(monkeypatch):
    """The key is never compared byte by byte: it is looked up by an HMAC under a per-process key
    (http/api_keys.py), so the time does not depend on how much of it matches."""
    from ridgeline.http.api_keys import ApiKeys
    looked, real = [], ApiKeys._digest

    def spy(self, key):
        looked.append(key)
        return real(self, key)

    monkeypatch.setattr(ApiKeys, "_digest", spy)
    fake = FakeReplica()
    settings = RouterSettings("round-robin", health_interval=3600, limits=FrontLimits(api_key="k"))
    rt = RouterThread(Router([Replica(fake.url, fake.info())], settings)).start()
    try:
        looked.clear()
        assert httpx.get(rt.url + "/metrics", headers={"Authorization": "Bearer kk"}).status_code == 401
        assert looked == ["kk"]
        assert httpx.get(rt.url + "/metrics", headers={"Authorization": "Bearer k"}).status_code == 200
        assert looked[-1] == "k"
    finally:
        rt.stop()
        fake.close()


def test_a_replica_refusing_the_routers_key_is_a_start_up_error(tiny_llama):
    engine = LLMEngine(EngineConfig.from_kwargs(str(tiny_llama), progress=False, **OPTS))
    keyed = ServerThread(build_app(engine, ServerSettings(MODEL, quiet=True, api_key="replica-key"))).start()
    try:
        for key in (None, "wrong"):
            with pytest.raises(RouterConfigError, match="refused the router's key: give the replicas' key as "
                                                        "--replica-api-key"):
                asyncio.run(build_router([keyed.url], RouterSettings("least-load", replica_api_key=key)))
        router = asyncio.run(build_router([keyed.url], RouterSettings("least-load", replica_api_key="replica-key")))
        assert router.replicas[0].info["model"] == MODEL
    finally:
        keyed.stop()
