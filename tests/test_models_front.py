"""`ridgeline serve --models a,b`: several models by name behind one endpoint, each started on its first
request, stopped after --keep-alive idle or (least recently used first) to stay under --models-memory; an
unknown model is a 404 naming the served ones. The fleet's rules with fake replicas, then end to end."""
from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from server_helpers import wait_until
from spawned import children, serve

from ridgeline.errors import InvalidRequestError
from ridgeline.router.fleet import Fleet, FleetError, FleetModel, parse_keep_alive
from ridgeline.serve.models_front import parse_models


class _FakeRouter:
    async def start(self):
        pass

    async def stop(self):
        pass


class _FakeLauncher:
    def __init__(self, log, name):
        self.log, self.name = log, name

    def stop(self):
        self.log.append(("stop", self.name))


def _fleet(sizes: dict[str, int], keep_alive=60.0, budget=None):
    log = []

    def start(spec):
        log.append(("start", spec["model"]))
        time.sleep(0.05)  # a load takes a while: concurrent requests must wait for the one start
        return _FakeLauncher(log, spec["model"]), [f"http://{spec['model']}"]

    async def build(urls):
        return _FakeRouter()

    models = [FleetModel(n, {"model": n}, b) for n, b in sizes.items()]
    return Fleet(models, keep_alive, budget, start, build), log


def test_a_model_starts_once_on_first_use_and_stops_when_idle():
    async def run():
        fleet, log = _fleet({"a": 1, "b": 1}, keep_alive=10)
        got = await asyncio.gather(*(fleet.acquire("a") for _ in range(5)))
        assert log == [("start", "a")] and all(m.loaded for m in got) and got[0].active == 5
        for m in got:
            fleet.release(m)
        assert await fleet.reap_once(time.monotonic() + 5) == []  # idle, but not for keep_alive yet
        assert await fleet.reap_once(time.monotonic() + 11) == ["a"] and log[-1] == ("stop", "a")
        assert not fleet.models["a"].loaded and not fleet.models["b"].loaded
        with pytest.raises(FleetError) as e:
            await fleet.acquire("nope")
        assert e.value.status == 404 and "a, b" in e.value.message
    asyncio.run(run())


def test_a_busy_model_is_never_stopped():
    async def run():
        fleet, log = _fleet({"a": 1}, keep_alive=0)
        m = await fleet.acquire("a")
        assert await fleet.reap_once(time.monotonic() + 100) == []  # a request in flight
        fleet.release(m)
        assert await fleet.reap_once() == ["a"]
    asyncio.run(run())


def test_the_least_recently_used_idle_model_makes_room():
    async def run():
        fleet, log = _fleet({"a": 4, "b": 4, "c": 4}, budget=8)
        for name in ("a", "b"):
            fleet.release(await fleet.acquire(name))
        fleet.release(await fleet.acquire("a"))  # b is now the least recently used
        fleet.release(await fleet.acquire("c"))
        assert ("stop", "b") in log and fleet.models["a"].loaded and not fleet.models["b"].loaded
        held = [await fleet.acquire("a"), await fleet.acquire("c")]  # both busy: no room for b
        with pytest.raises(FleetError) as e:
            await fleet.acquire("b")
        assert e.value.status == 503 and "budget" in e.value.message and fleet.models["b"].active == 0
        for m in held:
            fleet.release(m)
        await fleet.stop()
        assert not any(m.loaded for m in fleet.models.values())
    asyncio.run(run())


def test_keep_alive_as_ollama_writes_it():
    assert [parse_keep_alive(v) for v in (0, 30, 2.5, "10", "5m", "1h30m", "300ms", "-1", "-1m")] == \
        [0, 30, 2.5, 10, 300, 5400, 0.3, -1, -60]
    for bad in ("", "5 minutes", "m", True, None, [1], "1d"):
        with pytest.raises(FleetError):
            parse_keep_alive(bad)

    async def run():
        fleet, _ = _fleet({"a": 1, "b": 1}, keep_alive=600)
        for name, keep in (("a", 0.0), ("b", -1.0)):
            m = await fleet.acquire(name)
            m.keep_alive = keep  # what a request's keep_alive sets
            fleet.release(m)
        assert await fleet.reap_once(time.monotonic() + 10**6) == ["a"]  # b: negative, kept loaded
    asyncio.run(run())


def test_the_models_list_is_checked(tmp_path):
    assert parse_models("a=/x, b ,c=y") == [("a", "/x"), ("b", "b"), ("c", "y")]
    for bad in ("a=", "=x", "a,a", "a,,b"):
        with pytest.raises(InvalidRequestError):
            parse_models(bad)
    (tmp_path / "llama").mkdir()
    (tmp_path / "llama" / "config.json").write_text("{}")
    (tmp_path / "notes").mkdir()  # not a model: left out
    (tmp_path / "qwen-q4_k_m.gguf").write_bytes(b"GGUF")
    assert parse_models(str(tmp_path)) == [("llama", str(tmp_path / "llama")),
                                            ("qwen-q4_k_m", str(tmp_path / "qwen-q4_k_m.gguf"))]
    assert parse_models(str(tmp_path / "llama")) == [(str(tmp_path / "llama"),) * 2]  # a model folder itself
    (tmp_path / "llama.gguf").write_bytes(b"GGUF")
    with pytest.raises(InvalidRequestError, match="two models named 'llama'"):
        parse_models(str(tmp_path))
    with pytest.raises(InvalidRequestError, match="holds no model"):
        parse_models(str(tmp_path / "notes"))


@pytest.mark.slow  # starts replica processes
def test_two_models_behind_one_endpoint(tiny_llama, tmp_path):
    from conftest import make_tiny_model
    other = make_tiny_model(tmp_path / "qwen", "qwen2", seed=3)
    key = {"Authorization": "Bearer k"}
    args = ["--models", f"a={tiny_llama},b={other}", "--port", "0", "--dtype", "float32", "--kv-cache-memory",
            "2MiB", "--quiet", "--keep-alive", "600", "--api-key", "k"]
    with serve(args, r"at (http://\S+)/v1") as (proc, url):
        listed = httpx.get(url + "/v1/models", headers=key).json()["data"]
        assert [(m["id"], m["loaded"]) for m in listed] == [("a", False), ("b", False)]
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0}
        assert httpx.post(url + "/v1/chat/completions", json={**body, "model": "a"}).status_code == 401
        for name in ("a", "b"):
            r = httpx.post(url + "/v1/chat/completions", json={**body, "model": name}, headers=key, timeout=120)
            assert r.status_code == 200 and r.json()["model"] == name
        assert len(children(proc.pid)) == 3  # a process each, and one started ahead for the next load
        assert all(m["loaded"] for m in httpx.get(url + "/v1/models", headers=key).json()["data"])
        stream = httpx.post(url + "/v1/completions", json={"model": "a", "prompt": "x", "max_tokens": 3,
                                                           "stream": True}, headers=key)
        assert stream.status_code == 200 and stream.text.rstrip().endswith("data: [DONE]")
        r = httpx.post(url + "/v1/chat/completions", json={**body, "model": "c"}, headers=key)
        assert r.status_code == 404 and "a, b" in r.json()["error"]["message"]
        assert httpx.post(url + "/v1/chat/completions", json=body, headers=key).status_code == 400
        tags = httpx.get(url + "/api/tags", headers=key).json()["models"]
        assert [t["name"] for t in tags] == ["a", "b"]
        ps = httpx.get(url + "/api/ps", headers=key).json()["models"]
        assert sorted(p["name"] for p in ps) == ["a", "b"] and all(p["expires_at"] > "2026" for p in ps)
        assert httpx.get(url + "/api/version", headers=key).json()["version"]
        bad = httpx.post(url + "/api/chat", json={"model": "a", "messages": [], "keep_alive": "soon"}, headers=key)
        assert bad.status_code == 400 and "keep_alive" in bad.json()["error"]  # ollama's error shape
        gone = httpx.post(url + "/api/chat", json={"model": "c", "messages": []}, headers=key)
        assert gone.status_code == 404 and "a, b" in gone.json()["error"]
        for name in ("a", "b"):  # ollama's way to unload: keep_alive 0 (here on a load-only chat)
            r = httpx.post(url + "/api/chat", json={"model": name, "messages": [], "keep_alive": 0}, headers=key)
            assert r.status_code == 200, r.text
        wait_until(lambda: not any(m["loaded"] for m in httpx.get(url + "/v1/models", headers=key).json()["data"]),
                   "idle models stopped after their keep_alive")
        wait_until(lambda: len(children(proc.pid)) == 1, "their processes gone (the spare stays)")
        r = httpx.post(url + "/v1/chat/completions", json={**body, "model": "b"}, headers=key, timeout=120)
        assert r.status_code == 200  # started again
