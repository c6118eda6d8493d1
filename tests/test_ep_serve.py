"""`ridgeline serve --expert-parallel-size 2` as a real process on a tiny random Qwen2-MoE model (6
experts, a shared expert, a dense layer): it starts its second rank itself, serves completions and
chat, streamed and not, with the single-process engine's greedy text; /metrics carries the
per-expert and per-rank load; a rank that dies fails the request in flight with a clear error and
the server exits non-zero. Under torchrun (two processes it starts, as on two machines) the same
command serves the same text."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading

import httpx
import pytest
from conftest import make_tiny_model
from server_helpers import SAFETY_S, wait_until
from spawned import children
from test_server_cli import Served

from ridgeline.distributed.group import free_port
from ridgeline.entrypoints.llm import LLM
from ridgeline.sampling_params import SamplingParams

pytestmark = pytest.mark.slow  # every test here starts expert-parallel rank processes

EP = ("--expert-parallel-size", "2", "--quiet", "--no-console")
PROMPTS = ["Hello there, how are you?", "The quick brown fox jumps over"]
CHAT = [{"role": "user", "content": "Name three colours."}]
TOKENS = 16


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("ep-serve"), "qwen2_moe")


@pytest.fixture(scope="module")
def reference(moe) -> dict:
    llm = LLM(str(moe), dtype="float32", kv_cache_memory="24MiB", progress=False)
    p = SamplingParams(temperature=0, max_tokens=TOKENS, ignore_eos=True)
    return {"completions": [o.outputs[0].text for o in llm.generate(PROMPTS, p, use_tqdm=False)],
            "chat": llm.chat(CHAT, p, use_tqdm=False)[0].outputs[0].text}


@pytest.fixture(scope="module")
def server(moe):
    s = Served(moe, *EP)
    yield s
    s.close()


def _rank_pid(served: Served, rank: int) -> int:
    line = served.wait_for(f"parallel   rank {rank}/2")
    return int(re.search(r"pid (\d+)", line).group(1))


def _events(url: str, route: str, body: dict) -> list[dict]:
    with httpx.stream("POST", url + route, json=body | {"stream": True}, timeout=SAFETY_S) as r:
        data = [ln[6:] for ln in r.iter_lines() if ln.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


def test_completions_and_chat_match_one_process(server, reference):
    url, common = server.url, {"model": "tiny", "max_tokens": TOKENS, "temperature": 0, "ignore_eos": True}
    assert "expert parallel over 2 ranks" in server.output and "experts 3..5 of 6" in server.output
    for prompt, want in zip(PROMPTS, reference["completions"]):
        body = common | {"prompt": prompt}
        r = httpx.post(url + "/v1/completions", json=body, timeout=SAFETY_S)
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == want
        streamed = "".join(e["choices"][0]["text"] for e in _events(url, "/v1/completions", body) if e["choices"])
        assert streamed == want
    body = common | {"messages": CHAT}
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=SAFETY_S)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == reference["chat"]
    streamed = "".join(e["choices"][0]["delta"].get("content") or "" for e in _events(url, "/v1/chat/completions", body)
                       if e["choices"])
    assert streamed == reference["chat"]


def test_metrics_carry_per_expert_and_per_rank_load(server):
    httpx.post(server.url + "/v1/completions", json={"model": "tiny", "prompt": "abc", "max_tokens": 2},
               timeout=SAFETY_S)
    text = httpx.get(server.url + "/metrics").text
    per_expert = {m.group(1, 2): float(m.group(3)) for m in re.finditer(
        r'^ridgeline_moe_expert_routed_pairs_total\{expert="(\d+)",layer="(\d+)"\} (\S+)$', text, re.M)}
    per_rank = [float(m.group(1)) for m in re.finditer(r'^ridgeline_moe_rank_routed_pairs_total\{rank="\d"\} (\S+)$',
                                                       text, re.M)]
    total = float(re.search(r"^ridgeline_moe_routed_pairs_total (\S+)$", text, re.M).group(1))
    assert len(per_expert) == 6 and {layer for _, layer in per_expert} == {"0"}  # layer 1 is dense
    assert total > 0 and sum(per_expert.values()) == total == sum(per_rank) and len(per_rank) == 2
    assert per_rank[0] == sum(v for (e, _), v in per_expert.items() if int(e) < 3)


def test_a_dead_rank_fails_the_request_in_flight_and_ends_the_server(moe):
    s = Served(moe, *EP)
    try:
        pid = _rank_pid(s, 1)
        # rank 1 stopped: rank 0's next step waits in its first exchange, so the request below is in
        # flight, not finished, when rank 1 dies (no race with the model)
        os.kill(pid, signal.SIGSTOP)
        got: list[str] = []
        body = {"model": "tiny", "prompt": "a", "max_tokens": 64, "ignore_eos": True, "stream": True}

        def stream():
            with httpx.stream("POST", s.url + "/v1/completions", json=body, timeout=SAFETY_S) as r:
                got.extend(r.iter_lines())
        t = threading.Thread(target=stream)
        t.start()
        wait_until(lambda: _in_flight(s.url) >= 1, "the request was accepted")
        os.kill(pid, signal.SIGKILL)
        t.join(SAFETY_S)
        assert s.proc.wait(SAFETY_S) == 3
        text = "\n".join(got)
        assert re.search(rf"expert-parallel rank 1 \(pid {pid}\) died \(killed by signal 9\)", text), text
        assert "server is exiting" in text and "[DONE]" in text
        assert re.search(rf"expert-parallel rank 1 \(pid {pid}\) died", s.output), s.output[-3000:]
    finally:
        s.close()


def _in_flight(url: str) -> float:
    text = httpx.get(url + "/metrics").text
    return sum(float(m.group(1)) for m in re.finditer(r"^ridgeline_num_requests_(?:running|waiting) (\S+)$", text,
                                                      re.M))


def test_torchrun_launch_serves_the_same_text(moe, reference, tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("0123456789abcdef" * 2)
    secret.chmod(0o600)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), "-m", "ridgeline.cli", "serve", str(moe), "--port", "0",
           "--dtype", "float32", "--kv-cache-memory", "24MiB", "--served-model-name", "tiny",
           "--internal-secret-file", str(secret), *EP]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ranks: list[int] = []
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("serving"):
                break
        assert lines and lines[-1].startswith("serving"), "".join(lines)[-3000:]
        threading.Thread(target=proc.stdout.read, daemon=True).start()  # a full pipe would stall the ranks
        ranks = children(proc.pid)
        assert len(ranks) == 2 and "rank 1/2: experts 3..5 of 6" in "".join(lines)
        url = lines[-1].split(" at ")[1].split("/v1")[0]
        body = {"model": "tiny", "max_tokens": TOKENS, "temperature": 0, "ignore_eos": True, "prompt": PROMPTS[0]}
        wait_until(lambda: _healthy(url), "the server answers")
        r = httpx.post(url + "/v1/completions", json=body, timeout=SAFETY_S)
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == reference["completions"][0]
    finally:
        proc.send_signal(signal.SIGTERM)  # torchrun stops its ranks
        try:
            proc.wait(SAFETY_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for pid in ranks:  # never leave a rank behind, whatever happened above
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health").status_code == 200
    except httpx.TransportError:
        return False
