"""POST /tokenize and /detokenize in vLLM's shapes, GET /version, and a JSON 404 that lists the routes:
a prompt's ids are the engine's (those /v1/completions would run), chat messages tokenize as the chat
route renders them, ids round-trip, bad input is a 400 naming the field."""
from __future__ import annotations

import httpx
import pytest

from ridgeline.version import __version__


@pytest.fixture(scope="module")
def client(tiny_server):
    with httpx.Client(base_url=tiny_server.url, timeout=30) as c:
        yield c


def test_tokenize_a_prompt_and_back(client, tiny_engine):
    tok = tiny_engine.tokenizer
    r = client.post("/tokenize", json={"model": "tiny", "prompt": "Hello there", "return_token_strs": True})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["tokens"] == tok.encode("Hello there") and out["count"] == len(out["tokens"])
    assert out["max_model_len"] == tiny_engine.max_model_len and len(out["token_strs"]) == out["count"]
    assert "token_strs" not in client.post("/tokenize", json={"prompt": "x"}).json()
    back = client.post("/detokenize", json={"model": "tiny", "tokens": out["tokens"]})
    assert back.status_code == 200 and back.json() == {"prompt": tok.decode(out["tokens"])}


def test_tokenize_chat_messages_as_the_chat_route_renders_them(client, tiny_engine):
    msgs = [{"role": "user", "content": "hi <s> there"}]  # special-token text in content stays text
    r = client.post("/tokenize", json={"messages": msgs})
    assert r.status_code == 200, r.text
    assert r.json()["tokens"] == tiny_engine.tokenizer.encode_chat(msgs)
    no_prompt = client.post("/tokenize", json={"messages": msgs, "add_generation_prompt": False}).json()
    assert no_prompt["count"] < r.json()["count"]
    usage = client.post("/v1/chat/completions", json={"model": "tiny", "messages": msgs, "max_tokens": 1}).json()
    assert usage["usage"]["prompt_tokens"] == r.json()["count"]


@pytest.mark.parametrize("route,body,param", [
    ("/tokenize", {}, "prompt"),
    ("/tokenize", {"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, "messages"),
    ("/tokenize", {"prompt": 3}, "prompt"),
    ("/tokenize", {"prompt": "a", "model": "other"}, "model"),
    ("/detokenize", {"tokens": [1, 99999]}, "tokens"),
    ("/detokenize", {"tokens": [-1]}, "tokens"),
    ("/detokenize", {"tokens": "abc"}, "tokens"),
])
def test_bad_input_is_a_400_naming_the_field(client, route, body, param):
    r = client.post(route, json=body)
    assert r.status_code in (400, 404) and r.json()["error"]["param"] == param, r.text


def test_version_and_unknown_routes(client):
    assert client.get("/version").json() == {"version": __version__}
    r = client.get("/v1/embeddingz")
    assert r.status_code == 404
    err = r.json()["error"]
    assert err["code"] == "unknown_route" and "GET /v1/embeddingz" in err["message"]
    for route in ("POST /v1/chat/completions", "POST /v1/completions", "POST /tokenize", "GET /version",
                  "GET /v1/models"):
        assert route in err["message"], err["message"]
