"""Limits one client cannot get around: admission counts prompts x n, slow or stalled connections
are closed in bounded time, the connection cap, the API key's reach; and the server's log lines.
The limits of the HTTP front hold alike on every front Ridgeline runs (`fronts`: the server, a router
over one replica, a disaggregated front), each enforcing them itself: what it refuses never reaches
a replica or a worker. Raw sockets play the slow clients; every wait has a safety timeout that is
never the assertion."""
from __future__ import annotations

import contextlib
import logging
import socket
import threading

import httpx
import pytest
from front_helpers import KINDS, Backends
from server_helpers import SAFETY_S, StepGate, metric, wait_idle, wait_until

from ridgeline.config import EngineConfig
from ridgeline.engine.llm_engine import LLMEngine
from ridgeline.serve.app import build_app
from ridgeline.serve.server import ServerThread
from ridgeline.serve.state import ServerSettings

MODEL = "tiny"
CMPL = "/v1/completions"


@pytest.fixture(scope="module")
def engine(tiny_llama):
    return LLMEngine(EngineConfig.from_kwargs(str(tiny_llama), progress=False, dtype="float32",
                                              kv_cache_memory="2MiB"))


@pytest.fixture(scope="module", params=KINDS)
def fronts(request, tiny_llama):
    with Backends(request.param, tiny_llama) as b:
        yield b


@contextlib.contextmanager
def serving(engine, **settings):
    with ServerThread(build_app(engine, ServerSettings(MODEL, **settings))) as srv:
        yield srv


def body(**kw) -> dict:
    return {"model": MODEL, "prompt": "hi", "max_tokens": 2, **kw}


def test_admission_counts_prompts_times_n(engine):
    with serving(engine, max_waiting=4) as srv, StepGate(srv.app) as gate:
        url = srv.url
        for too_big, param in ((body(n=5), "n"), (body(prompt=["a", "b"], n=3), "n"),
                               (body(prompt=["a", "b", "c", "d", "e"]), "prompt")):
            r = httpx.post(url + CMPL, json=too_big)  # can never be admitted: not worth a retry
            assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
            assert "--max-waiting 4" in r.json()["error"]["message"] and "retry-after" not in r.headers
        done: list[httpx.Response] = []
        held = threading.Thread(target=lambda: done.append(httpx.post(url + CMPL, json=body(n=3), timeout=SAFETY_S)))
        held.start()
        wait_until(lambda: metric(url, "ridgeline_num_requests_waiting") == 1, "n=3 admitted")
        busy = httpx.post(url + CMPL, json=body(prompt=["a", "b"]))  # 3 + 2 > 4
        assert busy.status_code == 429 and busy.headers["retry-after"] == "1"
        assert busy.json()["error"]["code"] == "rate_limit_exceeded"
        assert httpx.post(url + CMPL, json=body(n=2)).status_code == 429
        fits = threading.Thread(target=lambda: done.append(httpx.post(url + CMPL, json=body(), timeout=SAFETY_S)))
        fits.start()  # 3 + 1 <= 4
        wait_until(lambda: metric(url, "ridgeline_num_requests_waiting") == 2, "n=1 admitted")
        gate.open()
        held.join(SAFETY_S)
        fits.join(SAFETY_S)
        assert [r.status_code for r in done] == [200, 200]


def _raw(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=SAFETY_S)
    return s


def _read_all(s: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    return data


def _read_response(s: socket.socket) -> bytes:
    """One whole response (headers and Content-Length body) from a connection that stays open."""
    def more() -> bytes:
        chunk = s.recv(65536)
        assert chunk, "the server closed the connection mid-response"
        return chunk

    data = b""
    while b"\r\n\r\n" not in data:
        data += more()
    head, _, rest = data.partition(b"\r\n\r\n")
    length = int(next(ln.split(b":")[1] for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")))
    while len(rest) < length:
        rest += more()
    return head + b"\r\n\r\n" + rest


HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"


def test_stalled_and_short_requests_are_closed_and_others_keep_being_served(fronts):
    with fronts.serving(timeout_header=0.3, timeout_body=0.3) as srv:
        idle, partial_head, partial_body, short_body, short_closed = (_raw(srv.url) for _ in range(5))
        partial_head.sendall(HEAD)  # and never the blank line
        payload = b'{"model": "tiny", "prompt": "hi"}'
        partial_body.sendall(HEAD + b"Content-Length: 1000\r\n\r\n" + payload[:10])
        short = HEAD + b"Content-Length: %d\r\n\r\n" % (len(payload) + 5) + payload  # 5 bytes short
        short_body.sendall(short)  # then waits for the answer
        short_closed.sendall(short)
        short_closed.shutdown(socket.SHUT_WR)  # the client is done sending
        assert httpx.get(srv.url + "/health").status_code == 200  # meanwhile, others are served
        assert _read_all(idle) == b""  # closed without a word: nothing was asked
        assert _read_all(partial_head).startswith(b"HTTP/1.1 408 ")
        for s in (partial_body, short_body):
            reply = _read_all(s)
            assert reply.startswith(b"HTTP/1.1 408 ") and b"--timeout-body" in reply, reply
        reply = _read_all(short_closed)  # the body can never complete: closed (at once, as a rule)
        assert reply == b"" or reply.startswith(b"HTTP/1.1 408 ")
        for s in (idle, partial_head, partial_body, short_body, short_closed):
            s.close()
        assert srv.reached() == 0, "a request whose headers or body never came got past the front"
        assert httpx.post(srv.url + CMPL, json=body(), timeout=SAFETY_S).status_code == 200
        assert srv.reached() >= 1
        wait_until(lambda: not srv.server.server_state.connections, "every connection freed")
        srv.wait_idle()


def test_a_body_over_the_limit_is_refused_without_resetting_the_upload(fronts):
    """The 413 comes before the body; the client still sends it, then reuses the connection. Had the
    server closed, the unread upload would have reset the connection under the client's feet."""
    with fronts.serving(max_body_bytes=100) as srv:
        s = _raw(srv.url)
        s.sendall(HEAD + b"Content-Length: 5000\r\n\r\n")
        reply = _read_response(s)
        assert reply.startswith(b"HTTP/1.1 413 ") and b"connection: close" not in reply.lower()
        assert b"--max-body-bytes" in reply
        s.sendall(b"x" * 5000 + b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _read_response(s).startswith(b"HTTP/1.1 200 ")
        s.close()
        chunked = httpx.post(srv.url + CMPL, content=iter([b'{"model": "tiny", "prompt": "', b"x" * 500, b'"}']),
                             headers={"Content-Type": "application/json"})  # no Content-Length: capped as it comes
        assert chunked.status_code == 413 and "--max-body-bytes" in chunked.json()["error"]["message"]
        assert srv.reached() == 0


def test_a_keep_alive_connection_gets_a_header_deadline_per_request(fronts):
    with fronts.serving(timeout_header=0.3) as srv:
        s = _raw(srv.url)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _read_response(s).startswith(b"HTTP/1.1 200 ")
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # the next request stalls in its headers
        assert _read_all(s).startswith(b"HTTP/1.1 408 ")
        s.close()


def test_over_the_connection_cap_new_connections_get_503_while_open_ones_proceed(fronts):
    with fronts.serving(max_connections=2) as srv:
        first, second = _raw(srv.url), _raw(srv.url)
        first.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # open, headers not finished
        second.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        over = _raw(srv.url)
        over.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        reply = _read_all(over)
        assert reply.startswith(b"HTTP/1.1 503 ") and b"--max-connections 2" in reply
        assert b"retry-after: 1" in reply.lower()
        first.sendall(b"\r\n")  # the open ones are served
        assert _read_response(first).startswith(b"HTTP/1.1 200 ")
        second.sendall(b"\r\n")
        assert _read_response(second).startswith(b"HTTP/1.1 200 ")
        for s in (first, second, over):
            s.close()
        wait_until(lambda: httpx.get(srv.url + "/health").status_code == 200, "a slot free again")


def test_api_key_covers_every_route_but_health_and_public_metrics_opens_only_metrics(fronts):
    auth = {"Authorization": "Bearer k"}
    for public in (False, True):
        with fronts.serving(api_key="k", public_metrics=public) as srv:
            for path in srv.guarded:  # metrics and docs included
                r = httpx.get(srv.url + path)
                expected = 200 if public and path == "/metrics" else 401
                assert r.status_code == expected, path
                if expected == 401:
                    assert r.json()["error"]["code"] == "invalid_api_key" and r.headers["www-authenticate"] == "Bearer"
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "k"}):
                r = httpx.post(srv.url + CMPL, json=body(), headers=headers)
                assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
            assert srv.reached() == 0, "refused by the front itself: nothing reached a replica, a worker, an engine"
            for path in srv.guarded:
                assert httpx.get(srv.url + path, headers=auth).status_code == 200, path
            assert httpx.post(srv.url + CMPL, json=body(), headers=auth, timeout=SAFETY_S).status_code == 200
            assert httpx.get(srv.url + "/health").status_code == 200
            assert httpx.head(srv.url + "/health").status_code == 200


def test_throughput_lines_while_busy_and_quiet_turns_the_log_lines_off(engine, caplog):
    for quiet in (False, True):
        caplog.clear()
        app = build_app(engine, ServerSettings(MODEL, quiet=quiet), log_interval=0.05)
        with caplog.at_level(logging.INFO, logger="ridgeline.serve"), ServerThread(app) as srv, \
                StepGate(app) as gate:
            t = threading.Thread(target=httpx.post, args=(srv.url + CMPL,), kwargs={"json": body(), "timeout": 60})
            t.start()
            wait_until(lambda: metric(srv.url, "ridgeline_num_requests_waiting") == 1, "admitted")
            if not quiet:  # busy: a request waits at the gate
                wait_until(lambda: any(m.startswith("throughput: ") for m in caplog.messages), "throughput line")
            gate.open()
            t.join(60)
            wait_idle(srv.url)
        lines = [m for m in caplog.messages if m.startswith(("throughput: ", "cmpl-"))]
        if quiet:
            assert lines == []
        else:
            line = next(m for m in lines if m.startswith("throughput: "))
            assert "tok/s" in line and "waiting" in line and "KV cache" in line
            assert sum(m.startswith("cmpl-") for m in lines) == 1
