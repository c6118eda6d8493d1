"""1P1D over HTTP, in one process: a prefill worker, a decode worker and the front, against a
co-located server on the same weights. Token-identical (completions and chat, streamed and not,
bf16 and int8 KV); a dropped or timed-out transfer is recomputed with the same answer; errors
come back as OpenAI bodies; no KV block is left on either worker after success, failure and a
client that goes away mid-stream."""
from __future__ import annotations

import json

import httpx
import pytest

from disagg_helpers import SAFETY_S, front_over, worker_server
from server_helpers import wait_until

from ridgeline.disagg.adopt import attach

PROMPTS = ["hello there, how are you", "x" * 70, "the quick brown fox"]


@pytest.fixture(scope="module", params=["bfloat16", "int8"])
def pd(request, tiny_llama):
    prefill, pw = worker_server(tiny_llama, "prefill", request.param)
    decode, dw = worker_server(tiny_llama, "decode", request.param)
    coloc, _ = worker_server(tiny_llama, "colocated", request.param)
    front = front_over([prefill], [decode])
    yield {"model": str(tiny_llama), "front": front.url, "coloc": coloc.url, "pw": pw, "dw": dw,
           "servers": (prefill, decode), "front_obj": front}
    front.stop()
    for s in (prefill, decode, coloc):
        s.stop()
    pw.close()
    dw.close()


def _body(pd, prompt: str, **kw) -> dict:
    return {"model": pd["model"], "prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": True,
            "skip_special_tokens": False, **kw}


def _text(url: str, body: dict, route: str = "/v1/completions") -> list[str]:
    if not body.get("stream"):
        r = httpx.post(url + route, json=body, timeout=SAFETY_S)
        assert r.status_code == 200, r.text
        return [c["text"] if "text" in c else c["message"]["content"] for c in r.json()["choices"]]
    parts: dict[int, str] = {}
    with httpx.stream("POST", url + route, json=body, timeout=SAFETY_S) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                for c in json.loads(line[6:])["choices"]:
                    parts[c["index"]] = parts.get(c["index"], "") + c.get("text", c.get("delta", {}).get("content", ""))
    return [parts[i] for i in sorted(parts)]


def _idle(pd) -> None:
    """Both workers back to no request and no used KV block (their step threads finish asynchronously)."""
    for server in pd["servers"]:
        ae = server.app.state.ridgeline.async_engine
        wait_until(lambda: ae.stats.kv_blocks_used == 0 and not ae._streams, "worker idle")  # noqa: SLF001
    assert len(pd["dw"].connector.inbox) == 0 and not pd["pw"].exports.targets
    # every transfer id the decode worker issued ended with its request (or its prefill's refusal)
    wait_until(lambda: pd["dw"].connector.inbox.outstanding == 0, "no transfer outstanding")


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_completions_identical_to_colocated(pd, stream):
    adopted = attach(pd["dw"].engine).stats.adopted
    for prompt in PROMPTS:
        body = _body(pd, prompt, stream=stream)
        assert _text(pd["front"], body) == _text(pd["coloc"], body)
    assert attach(pd["dw"].engine).stats.adopted - adopted == len(PROMPTS)
    _idle(pd)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_chat_identical_to_colocated(pd, stream):
    body = {"model": pd["model"], "messages": [{"role": "user", "content": "tell me a story"}], "max_tokens": 8,
            "temperature": 0, "stream": stream}
    assert _text(pd["front"], body, "/v1/chat/completions") == _text(pd["coloc"], body, "/v1/chat/completions")
    _idle(pd)


def test_not_disaggregated_requests_are_computed_on_the_decode_worker(pd):
    """n > 1 and several prompts skip the transfer: same answers, computed whole by the decode worker."""
    body = _body(pd, PROMPTS[0], n=2, temperature=0)
    assert _text(pd["front"], body) == _text(pd["coloc"], body)
    body = _body(pd, PROMPTS[:2])
    assert _text(pd["front"], body) == _text(pd["coloc"], body)
    assert pd["front_obj"].front.pd.counts.skipped >= 2
    _idle(pd)


@pytest.mark.parametrize("fault", ["drop", "stall"])
def test_failed_transfer_is_recomputed(pd, fault):
    connector = pd["pw"].connector
    connector.fault, timeout = fault, connector.timeout
    connector.timeout = 0.05  # a stall never ends by itself: its timeout is the only way out
    try:
        failed = pd["front_obj"].front.pd.counts.failed
        body = _body(pd, PROMPTS[1])
        assert _text(pd["front"], body) == _text(pd["coloc"], body)
        assert pd["front_obj"].front.pd.counts.failed == failed + 1
    finally:
        connector.fault, connector.timeout = None, timeout
    _idle(pd)


def test_client_gone_mid_stream_frees_both_workers(pd):
    body = _body(pd, PROMPTS[1], stream=True, max_tokens=400)
    with httpx.stream("POST", pd["front"] + "/v1/completions", json=body, timeout=SAFETY_S) as r:
        for line in r.iter_lines():
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["text"]:
                break  # a token came: the request is decoding; leave
    _idle(pd)


def test_errors_are_openai_bodies(pd):
    front = pd["front"]
    r = httpx.post(front + "/v1/completions", json=_body(pd, "hi", temperature=-1))
    assert r.status_code == 400 and r.json()["error"]["param"] == "temperature"
    r = httpx.post(front + "/v1/completions", json=_body(pd, "hi", model="other"))
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    r = httpx.post(front + "/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    assert httpx.get(front + "/v1/models").json()["data"][0]["id"] == pd["model"]
    assert httpx.get(front + "/health").json()["status"] == "ok"
    _idle(pd)


def test_a_constrained_request_and_the_ignored_fields_header_cross_the_front(pd):
    choices = ["alpha", "beta gamma"]
    for stream in (False, True):
        body = _body(pd, "pick one:", structured_outputs={"choice": choices}, ignore_eos=False, max_tokens=16,
                     stream=stream)
        assert _text(pd["front"], body)[0] in choices
        r = httpx.post(pd["front"] + "/v1/completions", json={**body, "my_flag": 1}, timeout=SAFETY_S)
        assert r.status_code == 200 and r.headers["x-ridgeline-ignored-fields"] == "my_flag"
    _idle(pd)
