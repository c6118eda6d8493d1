"""The console's JSON endpoints over plain HTTP: the page and its files, --no-console, the live view built
from the /metrics counters, auth like /metrics, and the calculators equal to `ridgeline advise ... --json`."""
from __future__ import annotations

import json

import httpx
import pytest
from server_helpers import StepGate, metric, wait_until

from ridgeline.cli import build_parser, main
from ridgeline.config import EngineConfig
from ridgeline.engine.llm_engine import LLMEngine
from ridgeline.serve.app import build_app
from ridgeline.serve.server import ServerThread
from ridgeline.serve.state import ServerSettings

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8, "temperature": 0}


def cli_json(capsys, *argv) -> dict:
    assert main(["advise", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_page_and_files_are_served(tiny_server):
    page = httpx.get(tiny_server.url + "/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    for name in ("main.js", "api.js", "chat.js", "live.js", "calc.js", "charts.js", "console.css"):
        assert httpx.get(tiny_server.url + "/console/static/" + name).status_code == 200, name
    # nothing the page loads comes from elsewhere (it must work offline)
    static = [page.text] + [httpx.get(tiny_server.url + "/console/static/" + n).text for n in ("main.js", "console.css")]
    assert not any("http://" in t or "https://" in t or "//cdn" in t for t in static)


def test_no_console_flag(tiny_engine):
    assert build_parser().parse_args(["serve", "--no-console"]).console is False
    assert build_parser().parse_args(["serve"]).console is True
    with ServerThread(build_app(tiny_engine, ServerSettings("tiny", quiet=True, console=False))) as s:
        for path in ("/console/api/live", "/console/static/main.js"):
            assert httpx.get(s.url + path).status_code == 404, path
        root = httpx.get(s.url + "/")  # without the console, / is ollama's liveness answer, not the page
        assert root.status_code == 200 and "text/html" not in root.headers["content-type"]
        assert "Ollama is running" in root.text
        assert httpx.post(s.url + "/console/api/advise/kv", json={}).status_code == 404


def test_live_view_follows_the_counters(tiny_server, monkeypatch):
    from ridgeline.serve.console import live
    monkeypatch.setattr(live, "MIN_INTERVAL_S", 0.0)  # every call keeps its sample: the series grows however fast
    url = tiny_server.url + "/console/api/live"
    before = httpx.get(url, params={"hardware": "Xeon-8480"}).json()
    assert before["kv"]["total"] == metric(tiny_server.url, "ridgeline_kv_cache_blocks_total")
    assert before["formats"]["weights"] and before["formats"]["kv"] == "f32"
    app = tiny_server.app
    with StepGate(app) as gate:  # a request held before its first step: the view shows it waiting
        with httpx.Client(timeout=60) as c:
            import threading
            done = threading.Event()
            threading.Thread(target=lambda: (c.post(tiny_server.url + "/v1/chat/completions", json=CHAT), done.set()),
                             daemon=True).start()
            wait_until(lambda: gate.parked, "request waiting at the gate")
            held = httpx.get(url).json()
            assert held["waiting"] + held["running"] == 1
            gate.open()
            wait_until(done.is_set, "request finished")
    after = httpx.get(url, params={"hardware": "Xeon-8480"}).json()
    assert after["tokens"]["generated_total"] == before["tokens"]["generated_total"] + 8
    assert after["recent"]["n"] == before["recent"]["n"] + 1
    assert after["recent"]["ttft"]["p50"] > 0 and after["recent"]["tpot"]["p99"] > 0
    assert after["wall"]["name"] in {"capacity", "bandwidth", "compute", "network", "slo-contention"}
    assert after["wall"]["workload"]["output_len"] >= 1 and after["wall"]["roofline"]["points"]
    w = after["wall"]  # the SLOs judged by the measured medians, the prediction beside them
    assert w["measured"]["ttft"] > 0 and w["measured"]["tpot"] > 0 and w["predicted"]["tpot"] > 0
    assert w["met"] == {k: w["measured"][k] <= w["slo"][k] for k in ("ttft", "tpot")}
    assert len(after["series"]) >= 2


def test_live_wall_without_profile_or_traffic_says_why(tiny_server, monkeypatch):
    from ridgeline.advisor import local_profile
    monkeypatch.setattr(local_profile, "cached_profile", lambda *a, **k: None)
    wall = httpx.get(tiny_server.url + "/console/api/live", params={"hardware": "local"}).json()["wall"]
    assert wall["name"] is None and wall["reason"]
    bad = httpx.get(tiny_server.url + "/console/api/live", params={"hardware": "no-such-chip"}).json()["wall"]
    assert bad["name"] is None and "unknown hardware" in bad["reason"]


def test_auth_like_metrics(tiny_engine):
    key = {"Authorization": "Bearer sesame"}
    for public in (False, True):
        settings = ServerSettings("tiny", quiet=True, api_key="sesame", public_metrics=public)
        with ServerThread(build_app(tiny_engine, settings)) as s:
            assert httpx.get(s.url + "/").status_code == 200  # the page asks for the key itself
            assert httpx.get(s.url + "/console/static/api.js").status_code == 200
            live = httpx.get(s.url + "/console/api/live")
            assert live.status_code == (200 if public else 401)
            assert httpx.get(s.url + "/metrics").status_code == live.status_code
            assert httpx.get(s.url + "/console/api/live", headers=key).status_code == 200
            assert httpx.post(s.url + "/console/api/advise/kv", json={}).status_code == 401
            assert httpx.get(s.url + "/console/api/advise", headers=key).status_code == 200
            assert httpx.get(s.url + "/console/static/../app.py").status_code in (401, 404)


INPUTS = [
    {"model": "Llama-3.1-70B", "hardware": "H100", "prompt_len": 2000, "output_len": 500, "concurrency": 64},
    {"model": "Qwen2.5-7B", "hardware": "L4", "weights": "fp8", "kv": "fp8", "prefix_share": 0.5},
    {"model": "Mixtral-8x7B", "hardware": "MI300X", "gpus": 2, "concurrency": 8, "alpha": 0.8, "draft_len": 3,
     "draft_cost": 0.1, "rate": 2.5, "tpot_slo_ms": 40},
]


def flags(body: dict) -> list[str]:
    return [x for k, v in body.items() for x in (f"--{k.replace('_', '-')}", str(v))]


@pytest.mark.parametrize("name", ["kv", "gpus", "spec", "disagg", "quant"])
@pytest.mark.parametrize("body", INPUTS, ids=["70b-h100", "qwen-l4-fp8", "mixtral-mi300x-rate"])
def test_calculators_equal_the_cli(tiny_server, capsys, name, body):
    r = httpx.post(tiny_server.url + f"/console/api/advise/{name}", json={k: str(v) for k, v in body.items()}, timeout=60)
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["json"] == cli_json(capsys, name, *flags(body))
    assert main(["advise", name, *flags(body)]) == 0
    assert got["text"] == capsys.readouterr().out.rstrip("\n")
    shown = {f"{v['key']}.{s['key']}": s for v in got["view"] for s in v["steps"]}
    for sec_key, sec in got["json"]["sections"].items():
        for key, value in sec["values"].items():
            assert shown[f"{sec_key}.{key}"]["value"] == value["value"]


def test_spec_slider_and_roofline(tiny_server):
    body = {"model": "Llama-3.1-8B", "hardware": "H100", "batch": 256}
    r = httpx.post(tiny_server.url + "/console/api/advise/spec", json=body).json()
    assert r["at_batch"]["batch"] == 256 and [c["batch"] for c in r["curve"]][:3] == [1, 2, 4]
    assert "batch 256: gain" in r["at_batch_text"]
    roof = httpx.post(tiny_server.url + "/console/api/advise/roofline", json=body).json()["roofline"]
    assert roof["peak"] > 0 and any(p["workload"] for p in roof["points"]) and len(roof["roof"]) == 3
    httpx.post(tiny_server.url + "/v1/chat/completions", json=CHAT)
    live = httpx.post(tiny_server.url + "/console/api/advise/roofline", json={"live": True, "hardware": "Xeon-8480"})
    assert live.status_code == 200 and live.json()["workload"]["output_len"] >= 1


@pytest.mark.parametrize("body, words", [
    ({"prompt_len": ""}, "prompt len is empty"),
    ({"prompt_len": "-5"}, "positive"),
    ({"concurrency": "0"}, "positive"),
    ({"prompt_len": "1e30"}, "out of range"),
    ({"prompt_len": "10000000"}, "maximum context"),
    ({"alpha": "nan"}, "finite"),
    ({"alpha": "1.5"}, "alpha"),
    ({"prefix_share": "abc"}, "must be a number"),
    ({"concurrency": "2.5"}, "whole number"),
    ({"gpus": "100000", "hardware": "H100-SXM"}, "gpus"),  # a table machine: no profile of this one needed
    ({"model": "/etc/passwd"}, "unknown model"),
    ({"hardware": "abacus"}, "unknown hardware"),
    ({"weights": "int3"}, "unknown precision"),
    ({"bogus": 1}, "unknown option"),
])
def test_bad_input_is_a_400_with_a_message(tiny_server, body, words):
    r = httpx.post(tiny_server.url + "/console/api/advise/kv", json={"model": "Llama-3.1-8B", **body})
    assert r.status_code == 400, r.text
    assert words in r.json()["error"]["message"]


def test_local_hardware_is_never_measured_from_a_request(tiny_server, monkeypatch):
    from ridgeline.advisor import local_profile
    monkeypatch.setattr(local_profile, "cached_profile", lambda *a, **k: None)
    monkeypatch.setattr(local_profile, "measure", lambda *a, **k: pytest.fail("measured"))
    r = httpx.post(tiny_server.url + "/console/api/advise/kv", json={"model": "Llama-3.1-8B", "hardware": "local"})
    assert r.status_code == 400 and "ridgeline advise --hardware local" in r.json()["error"]["message"]


def test_unknown_calculator(tiny_server):
    r = httpx.post(tiny_server.url + "/console/api/advise/nope", json={})
    assert r.status_code == 400 and "unknown calculator" in r.json()["error"]["message"]


def test_live_view_reports_speculative_acceptance_by_position(tiny_llama):
    engine = LLMEngine(EngineConfig.from_kwargs(
        str(tiny_llama), progress=False, dtype="float32", kv_cache_memory="2MiB", speculative_method="ngram",
        num_speculative_tokens=3, ngram_min=1, speculative_controller="off"))
    with ServerThread(build_app(engine, ServerSettings("tiny", quiet=True))) as s:
        assert httpx.post(s.url + "/v1/completions", json={
            "model": "tiny", "prompt": "abc abc abc abc abc abc", "max_tokens": 32, "temperature": 0,
            "ignore_eos": True}).status_code == 200
        spec = httpx.get(s.url + "/console/api/live").json()["speculative"]
    stats = engine.spec_stats
    assert spec["drafted"] == stats.proposed > 0 and spec["accepted"] == stats.accepted
    assert spec["by_position"] == stats.acceptance_by_position and len(spec["by_position"]) <= 3
    assert "ngram" in spec["method"]
