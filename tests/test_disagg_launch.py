"""`ridgeline serve --disaggregate xPyD` and `--role`: configuration errors at start-up, and a real
1P1D launch (two worker processes and the front) answering like a co-located engine."""
from __future__ import annotations

import signal
import subprocess
import sys
import threading

import httpx
import pytest

from ridgeline import LLM, SamplingParams
from ridgeline.cli import main
from ridgeline.disagg.front import DisaggConfigError, Worker, check_workers
from ridgeline.disagg.launch import parse_xpyd

SAFETY_S = 300.0


@pytest.mark.parametrize("text, x, y", [("1P1D", 1, 1), ("2p3d", 2, 3)])
def test_parse_xpyd(text, x, y):
    assert parse_xpyd(text) == (x, y)


@pytest.mark.parametrize("text, match", [("0P1D", "needs a prefill worker"), ("1P0D", "need a decode worker"),
                                         ("1D1P", "takes xPyD"), ("PD", "takes xPyD"), ("40P40D", "at most 64")])
def test_bad_xpyd_is_a_clear_error(text, match):
    with pytest.raises(DisaggConfigError, match=match):
        parse_xpyd(text)


def _info(role: str, fingerprint: str = "fp_a", kv: str = "k", address: str | None = "tcp://h:1") -> dict:
    return {"role": role, "model": "m", "fingerprint": fingerprint, "kv_spec": kv, "connector": "tcp",
            "address": address if role == "decode" else None, "internal": "tcp://h:2" if role == "prefill" else None}


def test_worker_sets_are_checked():
    p, d = Worker("http://p", _info("prefill")), Worker("http://d", _info("decode"))
    check_workers([p], [d])
    with pytest.raises(DisaggConfigError, match="needs a prefill worker"):
        check_workers([], [d])
    with pytest.raises(DisaggConfigError, match="no decode worker"):
        check_workers([p], [])
    with pytest.raises(DisaggConfigError, match="is a decode worker, not a prefill worker"):
        check_workers([d], [d])
    with pytest.raises(DisaggConfigError, match="mismatched workers.*model and configuration"):
        check_workers([Worker("http://p", _info("prefill", "fp_b"))], [d])
    with pytest.raises(DisaggConfigError, match="KV cache layout"):
        check_workers([Worker("http://p", _info("prefill", kv="other"))], [d])
    with pytest.raises(DisaggConfigError, match="no internal endpoint"):
        check_workers([Worker("http://p", {**_info("prefill"), "internal": None})], [d])


@pytest.mark.parametrize("argv, match", [
    (["--disaggregate", "0P1D"], "needs a prefill worker"),
    (["--disaggregate", "1P1D", "--role", "decode"], "exclude each other"),
    (["--kv-transfer-timeout", "0"], "--kv-transfer-timeout must be > 0"),
])
def test_serve_refuses_bad_configuration_before_loading(argv, match, capsys, tiny_llama):
    assert main(["serve", str(tiny_llama), "--port", "0", *argv]) == 2
    assert match in capsys.readouterr().err


@pytest.mark.slow  # starts rank / worker processes
def test_1p1d_launch_answers_like_a_colocated_engine(tiny_llama):
    cmd = [sys.executable, "-m", "ridgeline.cli", "serve", str(tiny_llama), "--disaggregate", "1P1D", "--port", "0",
           "--dtype", "float32", "--kv-cache-memory", "2MiB", "--kv-cache-dtype", "int8", "--kv-connector", "shm"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url, cores = None, None
        for line in proc.stdout:  # the front prints its address once both workers are checked
            if line.startswith("cores "):
                cores = line
            if line.startswith("serving") and "disaggregated" in line:  # not a worker's own line
                url = line.split(" at ")[1].split("/v1")[0]
                break
        assert url, "the front never started"
        threading.Thread(target=proc.stdout.read, daemon=True).start()  # keep the pipe drained
        prompts = ["hello there, how are you", "x" * 40]
        body = {"model": str(tiny_llama), "max_tokens": 6, "temperature": 0, "ignore_eos": True,
                "skip_special_tokens": False}
        got = [httpx.post(url + "/v1/completions", json={**body, "prompt": p}, timeout=SAFETY_S).json()
               ["choices"][0]["text"] for p in prompts]
        llm = LLM(str(tiny_llama), dtype="float32", kv_cache_memory="2MiB", kv_cache_dtype="int8", progress=False)
        want = [o.outputs[0].text for o in llm.generate(
            prompts, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, skip_special_tokens=False),
            use_tqdm=False)]
        assert got == want
        metrics = httpx.get(url + "/metrics").text
        assert 'ridgeline_disagg_transfers_total{status="sent"} 2' in metrics
        assert cores is not None and "prefill 1" in cores and "decode 1" in cores
        workers = {w["role"]: w for w in httpx.get(url + "/disagg/workers", timeout=SAFETY_S).json()["workers"]}
        steps = workers["decode"]["steps"]  # each request: its adopted first token, then 5 decode steps
        assert steps["intervals"] >= 2 * 4 and steps["prefill_intervals"] == 0 and steps["prompt_tokens"] == 0
        assert steps["adopt_cpu_s"] > 0 and workers["decode"]["adopted"] == 2
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(SAFETY_S)
    assert proc.returncode == 0


@pytest.mark.slow  # starts rank / worker processes
def test_1p1d_launch_with_an_api_key_becomes_ready_and_keeps_every_key_off_command_lines(tiny_llama):
    """The front checks the user's key; the workers take a key of their own (the readiness polls and
    every call from the front carry it), handed over by environment: no key on a worker's command line."""
    from spawned import children, serve
    key = "the-users-key"
    auth = {"Authorization": f"Bearer {key}"}
    args = [str(tiny_llama), "--disaggregate", "1P1D", "--port", "0", "--dtype", "float32", "--kv-cache-memory",
            "2MiB", "--served-model-name", "tiny", "--api-key", key, "--worker-start-timeout", "120"]
    with serve(args, r"disaggregated 1P1D at (http://\S+)/v1") as (proc, url):
        body = {"model": "tiny", "prompt": "hello", "max_tokens": 3, "temperature": 0}
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            r = httpx.post(url + "/v1/completions", json=body, headers=headers)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert httpx.get(url + "/metrics").status_code == 401
        r = httpx.post(url + "/v1/completions", json=body, headers=auth, timeout=SAFETY_S)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
        assert 'ridgeline_disagg_transfers_total{status="sent"} 1' in httpx.get(url + "/metrics", headers=auth).text
        workers = httpx.get(url + "/disagg/workers", headers=auth, timeout=SAFETY_S).json()["workers"]
        assert sorted(w["role"] for w in workers) == ["decode", "prefill"]  # the front reads them with their key
        pids = children(proc.pid)
        assert len(pids) == 2
        for pid in pids:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            assert b"--role" in argv and b"--api-key" not in argv and key.encode() not in b" ".join(argv)
        for w in workers:  # the user's key does not open a worker: it has its own
            assert httpx.post(w["url"] + "/v1/completions", json=body, headers=auth).status_code == 401
    assert proc.returncode == 0
