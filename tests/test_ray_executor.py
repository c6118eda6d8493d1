"""`ridgeline serve --executor ray`: two replicas as Ray actors on a head node started here on
loopback (`ray start --head`), placed by CPUs, behind the router. Slow: Ray's start takes ~10 s."""
from __future__ import annotations

import shutil
import subprocess
import tempfile
import time

import httpx
import pytest
from spawned import serve, stop

pytest.importorskip("ray", reason="Ray is not installed (pip install 'ridgeline[ray]')")
pytest.importorskip("zmq", reason="pyzmq is not installed (pip install 'ridgeline[router]')")
pytestmark = pytest.mark.slow


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_head():
    """A one-node cluster of 2 CPUs; --block keeps `ray start` in the foreground, so ending that one
    process ends the cluster (nothing else on the machine is touched)."""
    ray = shutil.which("ray") or pytest.skip("the `ray` command is not on PATH")
    folder, port = tempfile.mkdtemp(prefix="rt", dir="/tmp"), _free_port()
    head = subprocess.Popen([ray, "start", "--head", "--block", "--node-ip-address", "127.0.0.1", "--port", str(port),
                             "--num-cpus", "2", "--include-dashboard", "false", "--disable-usage-stats",
                             "--temp-dir", folder, "--object-store-memory", str(100 << 20)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for line in head.stdout:
            if "Ray runtime started" in line:
                break
        else:
            pytest.fail(f"ray start exited with code {head.wait()}")
        yield f"127.0.0.1:{port}"
    finally:
        stop(head)
        shutil.rmtree(folder, ignore_errors=True)


def test_replicas_as_ray_actors(ray_head, tiny_llama):
    args = [str(tiny_llama), "--port", "0", "--data-parallel-size", "2", "--executor", "ray", "--ray-address",
            ray_head, "--served-model-name", "tiny", "--dtype", "float32", "--kv-cache-memory", "2MiB", "--quiet"]
    with serve(args, r"at (http://\S+)/v1: 2 replicas \(ray\)") as (proc, url):
        health = httpx.get(url + "/health").json()
        assert health["status"] == "ok" and list(health["replicas"].values()) == ["up", "up"]
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hello " * 10}], "max_tokens": 3}
        for _ in range(3):
            assert httpx.post(url + "/v1/chat/completions", json=body, timeout=60).status_code == 200
    assert proc.returncode == 0


def test_no_cluster_is_a_clear_error(tiny_llama):
    from ridgeline.cli import main
    start = time.monotonic()
    rc = main(["serve", str(tiny_llama), "--port", "0", "--data-parallel-size", "2", "--executor", "ray",
               "--ray-address", f"127.0.0.1:{_free_port()}"])
    assert rc == 2 and time.monotonic() - start < 120
