"""`ridgeline serve` as a process: start-up report, then SIGTERM drains an in-flight stream and exits 0."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import httpx


def _start(model_dir) -> tuple[subprocess.Popen, str, list[str]]:
    cmd = [sys.executable, "-m", "ridgeline.cli", "serve", "--model", str(model_dir), "--port", "0",
           "--dtype", "float32", "--kv-cache-memory", "2MiB", "--served-model-name", "tiny", "--drain-timeout", "20"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("serving"):
            return proc, line.split(" at ")[1].split("/v1")[0], lines
    proc.kill()
    raise AssertionError("server exited before serving:\n" + "".join(lines))


def _wait_healthy(url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(url + "/health").status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "server never became healthy"
        time.sleep(0.05)


def test_serve_reports_startup_and_drains_on_sigterm(tiny_llama):
    proc, url, lines = _start(tiny_llama)
    try:
        out = "".join(lines)
        assert "kv cache" in out and "LlamaForCausalLM" in out and url.startswith("http://127.0.0.1:")
        _wait_healthy(url)
        body = {"model": "tiny", "prompt": "a", "max_tokens": 300, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}
        events = []
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                if not events:
                    proc.send_signal(signal.SIGTERM)  # mid-stream: the request must still finish
                events.append(line[6:])
        assert events[-1] == "[DONE]"
        usage = json.loads(events[-2])["usage"]
        assert usage["completion_tokens"] == 300
        assert proc.wait(timeout=30) == 0
        assert "draining" in proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
