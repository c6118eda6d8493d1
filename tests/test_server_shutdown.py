"""Stopping the server and failing inside it: a drain that finishes, requests during a drain, an engine
step that raises with other requests in flight, and 500s that never echo their cause. Every stall
is held on a StepGate, never raced against a timeout."""
from __future__ import annotations

import json
import logging
import threading

import httpx
import pytest
from server_helpers import StepGate, metric, wait_idle, wait_until

from ridgeline.config import EngineConfig
from ridgeline.engine.llm_engine import LLMEngine
from ridgeline.serve import completions
from ridgeline.serve.app import build_app
from ridgeline.serve.server import ServerThread
from ridgeline.serve.state import ServerSettings

MODEL = "tiny"
LONG = dict(model=MODEL, prompt="a", max_tokens=400, ignore_eos=True, logprobs=0)  # a chunk per token


@pytest.fixture(scope="module")
def engine(tiny_llama):
    return LLMEngine(EngineConfig.from_kwargs(str(tiny_llama), progress=False, dtype="float32",
                                              kv_cache_memory="2MiB"))


def _events(lines) -> list[str]:
    return [line[6:] for line in lines if line.startswith("data: ")]


def test_a_drain_that_finishes_in_time_ends_every_request_normally(engine):
    srv = ServerThread(build_app(engine, ServerSettings(MODEL)), drain_timeout=120).start()
    with StepGate(srv.app) as gate:
        with httpx.stream("POST", srv.url + "/v1/completions", json={**LONG, "stream": True}, timeout=60) as r:
            lines = r.iter_lines()
            gate.step()
            assert next(line for line in lines if line.startswith("data: {"))  # mid-stream
            stopper = threading.Thread(target=srv.stop)
            stopper.start()
            wait_until(lambda: srv.app.state.ridgeline.drain.draining, "drain started")
            gate.open()
            events = _events(lines)
        stopper.join(60)
    assert not stopper.is_alive() and events[-1] == "[DONE]"
    assert json.loads(events[-2])["choices"][0]["finish_reason"] == "length"
    assert not engine.has_unfinished()


def test_requests_during_a_drain_get_503_and_health_says_draining(engine):
    with ServerThread(build_app(engine, ServerSettings(MODEL))) as srv:
        srv.app.state.ridgeline.drain.begin()  # what shutdown does first, before it stops the server
        r = httpx.post(srv.url + "/v1/completions", json={"model": MODEL, "prompt": "hi"})
        assert r.status_code == 503 and r.json()["error"]["type"] == "service_unavailable"
        assert r.headers["retry-after"] and r.headers["connection"] == "close"
        health = httpx.get(srv.url + "/health")
        assert health.status_code == 503 and health.json() == {"status": "draining"}


def test_a_step_that_raises_ends_its_requests_with_a_generic_500_once(engine, caplog):
    """Two requests co-batched in a step that raises: each gets the same generic 500 (the cause only
    in the log, once), the failed step is never retried, and the engine keeps serving."""
    calls = []

    def poisoned(*a, **k):
        calls.append(1)
        raise RuntimeError("kernel fault at /secret/path while reading prompt 'hunter2'")

    with ServerThread(build_app(engine, ServerSettings(MODEL))) as srv, StepGate(srv.app) as gate:
        url = srv.url
        seeded = {"model": MODEL, "prompt": "seeded", "max_tokens": 8, "temperature": 1.0, "seed": 3,
                  "ignore_eos": True}
        gate.open()
        before = httpx.post(url + "/v1/completions", json=seeded, timeout=60).json()["choices"][0]["text"]
        gate.close()
        plain: list[httpx.Response] = []
        waiter = threading.Thread(target=lambda: plain.append(
            httpx.post(url + "/v1/completions", json={**LONG, "n": 2}, timeout=60)))
        with caplog.at_level(logging.ERROR), \
                httpx.stream("POST", url + "/v1/completions", json={**LONG, "stream": True}, timeout=60) as r:
            waiter.start()
            wait_until(lambda: metric(url, "ridgeline_num_requests_waiting") == 2, "both requests admitted")
            engine.step = poisoned
            try:
                gate.open()
                events = _events(r.iter_lines())
                waiter.join(60)
            finally:
                del engine.step
        assert calls == [1]  # ended, not retried: a retry would advance seeded generators twice
        assert events[-1] == "[DONE]"
        stream_error = json.loads(events[-2])["error"]
        [p] = plain
        assert p.status_code == 500 and p.json()["error"] == stream_error
        assert stream_error == {"message": "internal error", "type": "server_error", "param": None, "code": None}
        assert "secret" not in p.text and "hunter2" not in "".join(events)
        errors = [rec for rec in caplog.records if rec.levelno >= logging.ERROR]
        assert len(errors) == 1 and "kernel fault" in caplog.text  # one line (and its traceback)
        wait_idle(url)
        after = httpx.post(url + "/v1/completions", json=seeded, timeout=60).json()["choices"][0]["text"]
        assert after == before  # the engine still serves, seeded sampling unchanged
    engine.kv.check_integrity()


def test_an_unexpected_error_in_a_route_is_a_generic_500(engine, monkeypatch, caplog):
    with ServerThread(build_app(engine, ServerSettings(MODEL))) as srv:
        tok = engine.tokenizer
        monkeypatch.setattr(tok, "encode", lambda *a, **k: (_ for _ in ()).throw(KeyError("internal detail")))
        with caplog.at_level(logging.ERROR):
            r = httpx.post(srv.url + "/v1/completions", json={"model": MODEL, "prompt": "hi"}, timeout=60)
        monkeypatch.undo()
        assert r.status_code == 500 and r.headers["content-type"] == "application/json"
        assert r.json()["error"] == {"message": "internal error", "type": "server_error", "param": None,
                                     "code": None}
        assert "internal detail" in caplog.text and "internal detail" not in r.text

        def broken(*a, **k):
            raise ValueError("formatter detail")

        monkeypatch.setattr(completions, "completion_logprobs", broken)  # fails mid-stream
        with httpx.stream("POST", srv.url + "/v1/completions", timeout=60,
                          json={"model": MODEL, "prompt": "hi", "stream": True, "logprobs": 1}) as s:
            events = _events(s.iter_lines())
        assert events[-1] == "[DONE]" and json.loads(events[-2])["error"]["message"] == "internal error"
        assert "formatter detail" not in "".join(events)
        wait_idle(srv.url)
