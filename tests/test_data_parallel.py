"""`ridgeline serve --data-parallel-size 2 --api-key K` on the tiny model: two replica processes behind
one endpoint with cache-aware routing; the key is checked by the router, the replicas take a key of
their own that is on no command line; a replica killed is taken out, both killed gives 503."""
from __future__ import annotations

import os
import signal

import httpx
import pytest
from server_helpers import metric, wait_until
from spawned import children, serve

from ridgeline.utils.cpus import core_shares

pytest.importorskip("zmq", reason="pyzmq is not installed (pip install 'ridgeline[router]')")
KEY = "the-users-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


def test_core_shares_split_the_cores():
    assert core_shares(2, [0, 1, 2, 3, 4]) == [[0, 1, 2], [3, 4]]
    assert core_shares(1, [3, 1]) == [[1, 3]]
    assert core_shares(3, [0, 1]) == [[], [], []]


@pytest.fixture
def dp_server(tiny_llama):
    with serve([str(tiny_llama), "--port", "0", "--data-parallel-size", "2", "--served-model-name", "tiny",
                "--dtype", "float32", "--kv-cache-memory", "2MiB", "--quiet", "--api-key", KEY],
               r"at (http://\S+)/v1: 2 replicas") as got:
        yield got


@pytest.mark.slow  # starts replica processes
def test_two_replicas_behind_one_endpoint(dp_server):
    proc, url = dp_server
    body = {"model": "tiny", "messages": [{"role": "system", "content": "shared prefix " * 12},
                                          {"role": "user", "content": "hi"}], "max_tokens": 3}
    assert httpx.post(url + "/v1/chat/completions", json=body, timeout=60).status_code == 401
    for _ in range(3):
        assert httpx.post(url + "/v1/chat/completions", json=body, headers=AUTH, timeout=60).status_code == 200
    health = httpx.get(url + "/health").json()
    assert health["status"] == "ok" and list(health["replicas"].values()) == ["up", "up"]
    assert metric(url, "ridgeline_prefix_cache_hits_total", headers=AUTH) > 0, \
        "cache-aware: later requests hit the first's blocks"
    replicas = children(proc.pid)
    assert len(replicas) == 2
    for pid in replicas:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
        assert KEY.encode() not in cmdline and b"api_key" not in cmdline, "a key on a replica's command line"
    for replica_url in health["replicas"]:  # each has a key of its own: neither the client's nor none opens it
        for headers in ({}, AUTH):
            assert httpx.get(replica_url + "/v1/models", headers=headers).status_code == 401
    os.kill(replicas[0], signal.SIGKILL)
    wait_until(lambda: "down" in " ".join(httpx.get(url + "/health").json()["replicas"].values()), "replica down")
    for _ in range(2):
        assert httpx.post(url + "/v1/chat/completions", json=body, headers=AUTH, timeout=60).status_code == 200
    os.kill(replicas[1], signal.SIGKILL)
    wait_until(lambda: httpx.get(url + "/health").status_code == 503, "every replica down")
    r = httpx.post(url + "/v1/chat/completions", json=body, headers=AUTH, timeout=60)
    assert r.status_code == 503 and r.json()["error"]["code"] == "no_replica_available"
    assert "process exited" in r.json()["error"]["message"]
